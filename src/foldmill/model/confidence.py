"""Boltz-2 confidence module: pLDDT, PAE, PDE, resolved logits and the summary metrics.

forward(s_inputs (B, N, token_s), s (B, N, token_s), z (B, N, N, token_z),
        x_pred (B * mult, M, 3) or (B, mult, M, 3), feats, pred_distogram_logits (B, N, N, bins),
        multiplicity=mult, run_sequentially=False) -> dict with, per sample (first dim B * mult):
  plddt_logits (N, 50), plddt (N,), resolved_logits (N, 2), pae / pde (N, N) in A (their
  (N, N, 64) logits too with return_pair_logits: 5 samples hold 2.5 GiB of them at 1,000 tokens),
  complex_plddt, complex_iplddt, complex_pde, complex_ipde, complex_pae, complex_ipae,
  complex_pae_unweighted, complex_ipae_unweighted, ptm, iptm, ligand_iptm, protein_iptm,
  confidence_score (scalars per sample), and chain-keyed dicts
  {asym_id: (B * mult,)}: chains_pae, chains_pae_unweighted, chains_ptm; pair-chain dicts
  {asym_id: {asym_id: (B * mult,)}}: pair_chains_pae, pair_chains_pae_unweighted, pair_chains_iptm;
  plus s_conf / z_conf when return_latent_feats.

The trunk's s and z are re-normalised, re-embedded with the inputs (relative positions,
bonds, contact constraints, s_inputs outer terms) and with a distogram of the predicted
structure's representative atoms, refined by a pairformer stack, and read out by the
heads. Parameter names match the Boltz-2 checkpoint (`confidence_module.*`, including
the `boundaries` buffer).

Memory (one sample at 6,000 tokens: a (N, N, 128) fp32 pair tensor is 17.2 GiB): the embedding sums
accumulate into the module's own z in place (same values), the per-pair embeddings (relative
positions, bonds, bond types, contact constraints, the s_inputs outer product, predicted distances)
are computed and added by blocks of token rows (foldmill.kernels.token_rows; unblocked, the contact
conditioning alone made ~60 GiB of temporaries and the relative positions' int64 one-hots ran a
6,000-token H200 run out of memory), and the PAE/PDE logits keep the heads' dtype (bf16 under
autocast, 4.3 GiB each) instead of being promoted to fp32 by a float mask.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from foldmill.kernels.token_rows import rows_per_block
from foldmill.model import confidence_metrics as metrics
from foldmill.model.contact_conditioning import ContactConditioning
from foldmill.model.layers.layer_norm import LayerNorm
from foldmill.model.layers.pairformer import PairformerModule
from foldmill.model.relative_position import RelativePositionEncoder
from foldmill.model.residual import accumulate
from foldmill.vocab import BOND_TYPES

PAE_MAX = 32.0  # A, upper end of the PAE / PDE bins


class ConfidenceHeads(nn.Module):
    """Linear read-outs: PAE and PDE from z (optionally separate intra-/inter-chain heads),
    pLDDT and resolved from s."""

    def __init__(
        self,
        token_s: int,
        token_z: int,
        num_plddt_bins: int = 50,
        num_pde_bins: int = 64,
        num_pae_bins: int = 64,
        use_separate_heads: bool = False,
        **unused_options: Any,
    ) -> None:
        super().__init__()
        self.use_separate_heads = use_separate_heads
        if use_separate_heads:
            self.to_pae_intra_logits = nn.Linear(token_z, num_pae_bins, bias=False)
            self.to_pae_inter_logits = nn.Linear(token_z, num_pae_bins, bias=False)
            self.to_pde_intra_logits = nn.Linear(token_z, num_pde_bins, bias=False)
            self.to_pde_inter_logits = nn.Linear(token_z, num_pde_bins, bias=False)
        else:
            self.to_pae_logits = nn.Linear(token_z, num_pae_bins, bias=False)
            self.to_pde_logits = nn.Linear(token_z, num_pde_bins, bias=False)
        self.to_plddt_logits = nn.Linear(token_s, num_plddt_bins, bias=False)
        self.to_resolved_logits = nn.Linear(token_s, 2, bias=False)

    def _pair_logits(self, z: Tensor, same_chain: Tensor | None, name: str) -> Tensor:
        if not self.use_separate_heads:
            return getattr(self, f"to_{name}_logits")(z)
        # Selecting is what Boltz-2's masked sum (intra * same + inter * other) computes, without the
        # fp32 promotion of two (N, N, bins) tensors by the float masks.
        intra = getattr(self, f"to_{name}_intra_logits")(z)
        inter = getattr(self, f"to_{name}_inter_logits")(z)
        return torch.where(same_chain.unsqueeze(-1), intra, inter)

    def forward(self, s: Tensor, z: Tensor, asym_id: Tensor) -> dict[str, Tensor]:
        """s (BM, N, token_s), z (BM, N, N, token_z), asym_id (BM, N) -> logits."""
        same_chain = asym_id.unsqueeze(-1) == asym_id.unsqueeze(-2) if self.use_separate_heads else None
        return {
            "pae_logits": self._pair_logits(z, same_chain, "pae"),
            "pde_logits": self._pair_logits(z + z.transpose(1, 2), same_chain, "pde"),
            "resolved_logits": self.to_resolved_logits(s),
            "plddt_logits": self.to_plddt_logits(s),
        }


def _accumulate_by_rows(z: Tensor, pair_fn: Callable[[slice], Tensor]) -> Tensor:
    """z + pair_fn(all rows), computed and added by blocks of token rows into z's own storage (converted
    once to the sum's dtype, as `z + update` would promote it). z must be the caller's private tensor."""
    tokens = z.shape[1]
    rows = rows_per_block(tokens)
    for start in range(0, tokens, rows):
        block = pair_fn(slice(start, start + rows))
        z = z.to(torch.result_type(z, block))
        z[:, start : start + rows] += block
    return z


def _per_sample(x: Tensor, multiplicity: int) -> Tensor:
    """x repeated for each sample, record-major; x itself (no copy) for one sample."""
    return x if multiplicity == 1 else x.repeat_interleave(multiplicity, 0)


def _concat_samples(outputs: list[Any]) -> Any:
    """Concatenate per-sample outputs along the batch dimension, recursing into chain-keyed dicts."""
    if isinstance(outputs[0], dict):
        return {key: _concat_samples([out[key] for out in outputs]) for key in outputs[0]}
    return torch.cat(outputs, dim=0)


class ConfidenceModule(nn.Module):
    """AF3 Algorithm 31 with Boltz-2's input re-embedding."""

    def __init__(
        self,
        token_s: int,
        token_z: int,
        pairformer_args: dict[str, Any],
        num_dist_bins: int = 64,
        token_level_confidence: bool = True,
        max_dist: float = 22,
        add_s_to_z_prod: bool = False,
        add_s_input_to_s: bool = False,
        add_z_input_to_z: bool = False,
        maximum_bond_distance: int = 0,
        bond_type_feature: bool = False,
        confidence_args: dict[str, Any] | None = None,
        fix_sym_check: bool = False,
        cyclic_pos_enc: bool = False,
        return_latent_feats: bool = False,
        return_pair_logits: bool = False,
        conditioning_cutoff_min: float | None = None,
        conditioning_cutoff_max: float | None = None,
        **training_options: Any,
    ) -> None:
        """training_options (compile_pairformer, use_s_diffusion, ...) are accepted and ignored."""
        super().__init__()
        if not token_level_confidence:
            raise ValueError(
                "atom-level confidence (token_level_confidence=False) is not supported; Boltz-2 is token-level"
            )
        self.no_update_s = pairformer_args.get("no_update_s", False)
        self.add_s_to_z_prod = add_s_to_z_prod
        self.add_s_input_to_s = add_s_input_to_s
        self.add_z_input_to_z = add_z_input_to_z
        self.bond_type_feature = bond_type_feature
        self.return_latent_feats = return_latent_feats
        self.return_pair_logits = return_pair_logits

        self.register_buffer("boundaries", torch.linspace(2, max_dist, num_dist_bins - 1))
        self.dist_bin_pairwise_embed = nn.Embedding(num_dist_bins, token_z)
        self.s_to_z = nn.Linear(token_s, token_z, bias=False)
        self.s_to_z_transpose = nn.Linear(token_s, token_z, bias=False)
        if add_s_to_z_prod:
            self.s_to_z_prod_in1 = nn.Linear(token_s, token_z, bias=False)
            self.s_to_z_prod_in2 = nn.Linear(token_s, token_z, bias=False)
            self.s_to_z_prod_out = nn.Linear(token_z, token_z, bias=False)
        self.s_inputs_norm = LayerNorm(token_s)
        if not self.no_update_s:
            self.s_norm = LayerNorm(token_s)
        self.z_norm = LayerNorm(token_z)
        if add_s_input_to_s:
            self.s_input_to_s = nn.Linear(token_s, token_s, bias=False)
        if add_z_input_to_z:
            self.rel_pos = RelativePositionEncoder(token_z, fix_sym_check=fix_sym_check, cyclic_pos_enc=cyclic_pos_enc)
            bond_features = 1 if maximum_bond_distance == 0 else maximum_bond_distance + 2
            self.token_bonds = nn.Linear(bond_features, token_z, bias=False)
            if bond_type_feature:
                self.token_bonds_type = nn.Embedding(len(BOND_TYPES) + 1, token_z)  # 0 = no bond
            self.contact_conditioning = ContactConditioning(token_z, conditioning_cutoff_min, conditioning_cutoff_max)
        self.pairformer_stack = PairformerModule(token_s, token_z, **pairformer_args)
        self.confidence_heads = ConfidenceHeads(token_s, token_z, **(confidence_args or {}))

    def _embed(
        self, s_inputs: Tensor, s: Tensor, z: Tensor, rep_distances: Tensor, feats: dict[str, Tensor], multiplicity: int
    ) -> tuple[Tensor, Tensor]:
        """Inputs to the confidence pairformer: s (BM, N, token_s), z (BM, N, N, token_z)."""
        s_inputs = self.s_inputs_norm(s_inputs)
        if not self.no_update_s:
            s = self.s_norm(s)
        if self.add_s_input_to_s:
            s = s + self.s_input_to_s(s_inputs)
        z = self.z_norm(z)  # a new tensor: from here on z is this method's own
        if self.add_z_input_to_z:
            z = _accumulate_by_rows(z, lambda rows: self.rel_pos(feats, rows))
            z = _accumulate_by_rows(z, lambda rows: self.token_bonds(feats["token_bonds"][:, rows].float()))
            if self.bond_type_feature:
                z = _accumulate_by_rows(z, lambda rows: self.token_bonds_type(feats["type_bonds"][:, rows].long()))
            z = _accumulate_by_rows(z, lambda rows: self.contact_conditioning(feats, rows))
        z = accumulate(z, self.s_to_z(s_inputs)[:, :, None, :])
        z = accumulate(z, self.s_to_z_transpose(s_inputs)[:, None, :, :])
        if self.add_s_to_z_prod:
            prod_in1, prod_in2 = self.s_to_z_prod_in1(s_inputs), self.s_to_z_prod_in2(s_inputs)
            z = _accumulate_by_rows(
                z, lambda rows: self.s_to_z_prod_out(prod_in1[:, rows, None, :] * prod_in2[:, None, :, :])
            )
        s = _per_sample(s, multiplicity)
        z = _per_sample(z, multiplicity)
        distance_bins = (rep_distances.unsqueeze(-1) > self.boundaries).sum(dim=-1)
        return s, _accumulate_by_rows(z, lambda rows: self.dist_bin_pairwise_embed(distance_bins[:, rows]))

    def _forward_samples(
        self,
        s_inputs: Tensor,
        s: Tensor,
        z: Tensor,
        x_pred: Tensor,
        feats: dict[str, Tensor],
        pred_distogram_logits: Tensor,
        multiplicity: int,
    ) -> dict[str, Any]:
        if x_pred.dim() == 4:
            x_pred = x_pred.reshape(-1, *x_pred.shape[2:])
        token_to_rep_atom = feats["token_to_rep_atom"].repeat_interleave(multiplicity, 0)
        rep_coords = torch.bmm(token_to_rep_atom.float(), x_pred)
        # cdist exactly as Boltz-2 calls it: its matmul path decides which bin borderline pairs land in.
        rep_distances = torch.cdist(rep_coords, rep_coords)

        s, z = self._embed(s_inputs, s, z, rep_distances, feats, multiplicity)
        mask = feats["token_pad_mask"].repeat_interleave(multiplicity, 0)
        s, z = self.pairformer_stack(s, z, mask, mask[:, :, None] * mask[:, None, :], in_place=True)  # _embed's own z

        out: dict[str, Any] = {"s_conf": s, "z_conf": z} if self.return_latent_feats else {}
        out.update(self.confidence_heads(s, z, feats["asym_id"].repeat_interleave(multiplicity, 0)))
        out.update(self._metrics(out, x_pred, rep_distances, feats, pred_distogram_logits, multiplicity))
        if not self.return_pair_logits:  # read by the metrics above; 2 x (N, N, 64) per sample kept otherwise
            del out["pae_logits"], out["pde_logits"]
        return out

    @staticmethod
    def _metrics(
        logits: dict[str, Tensor],
        x_pred: Tensor,
        rep_distances: Tensor,
        feats: dict[str, Tensor],
        pred_distogram_logits: Tensor,
        multiplicity: int,
    ) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out["plddt"] = metrics.expected_value(logits["plddt_logits"])
        out["complex_plddt"], out["complex_iplddt"] = metrics.plddt_summaries(
            out["plddt"], rep_distances, feats, multiplicity
        )
        pair, interface_pair = metrics.contact_weighted_pair_masks(pred_distogram_logits, feats, multiplicity)
        out["pde"] = metrics.expected_value(logits["pde_logits"], end=PAE_MAX)
        out["complex_pde"], out["complex_ipde"] = metrics.pde_summaries(out["pde"], pair, interface_pair)
        out["pae"] = metrics.expected_value(logits["pae_logits"], end=PAE_MAX)
        out["complex_pae"], out["complex_ipae"], out["chains_pae"], out["pair_chains_pae"] = metrics.pae_summaries(
            out["pae"], pair, interface_pair, feats, multiplicity
        )
        frames = metrics.frame_mask(x_pred, feats, multiplicity)
        out["ptm"], out["iptm"], out["ligand_iptm"], out["protein_iptm"], out["pair_chains_iptm"] = metrics.tm_scores(
            logits["pae_logits"], frames, feats, multiplicity
        )
        out["chains_ptm"] = {chain: by_chain[chain] for chain, by_chain in out["pair_chains_iptm"].items()}
        (
            out["complex_pae_unweighted"],
            out["complex_ipae_unweighted"],
            out["chains_pae_unweighted"],
            out["pair_chains_pae_unweighted"],
        ) = metrics.unweighted_pae_summaries(out["pae"], frames, feats, multiplicity)
        return out

    def forward(
        self,
        s_inputs: Tensor,
        s: Tensor,
        z: Tensor,
        x_pred: Tensor,
        feats: dict[str, Tensor],
        pred_distogram_logits: Tensor,
        multiplicity: int = 1,
        run_sequentially: bool = False,
    ) -> dict[str, Any]:
        """run_sequentially scores one sample at a time (batch size 1) to bound memory."""
        if run_sequentially and multiplicity > 1:
            if z.shape[0] != 1:
                raise ValueError("run_sequentially needs batch size 1")
            samples = x_pred.reshape(-1, *x_pred.shape[-2:])
            out = _concat_samples(
                [
                    self._forward_samples(s_inputs, s, z, samples[i : i + 1], feats, pred_distogram_logits, 1)
                    for i in range(multiplicity)
                ]
            )
        else:
            out = self._forward_samples(s_inputs, s, z, x_pred, feats, pred_distogram_logits, multiplicity)
        out["confidence_score"] = metrics.confidence_score(out["complex_plddt"], out["ptm"], out["iptm"])
        return out
