"""The Boltz-2-compatible folding model: trunk, structure sampler and confidence in one module.

Engine API (what the executor codes against):
- `Boltz2.from_checkpoint(path, config=None)`: the published Lightning checkpoint
  (`boltz2_conf.ckpt`), a plain state_dict file or .safetensors, loaded safely and strictly
  (see foldmill.model.checkpoint); the architecture is read from the weights unless given.
- `foldmill.model.demo.demo_model(config, seed)`: seeded random weights, provenance "demo".
- `model.predict(features, recipe) -> dict[str, Tensor]`, features being the Boltz-2 feature
  dict of a batch (B records, usually 1; see foldmill.features). For S = B * diffusion
  samples, record-major, the result holds:
    sample_atom_coords (S, n_atoms_padded, 3) A; plddt (S, T) in [0, 1];
    pae, pde (S, T, T) A; ptm, iptm, ligand_iptm, protein_iptm, complex_plddt,
    complex_iplddt, complex_pde, complex_ipde, confidence_score (S,);
    chains_ptm (S, C) and pair_chains_iptm (S, C, C) with chains in asym_id order 0..C-1;
    pdistogram (B, T, T, 64) logits; pbfactor (B, T, 64) logits;
    s (B, T, token_s) and z (B, T, T, token_z), the trunk's final representations.
- `model.provenance`: what produced the weights (written into every output).

Inference order (Boltz-2): input embedding -> s/z initialisation (relative positions, token
bonds, contact conditioning) -> recycling passes of template module, MSA module and
pairformer -> distogram and B-factor heads -> diffusion conditioning -> EDM sampling ->
confidence. Attribute names are those of the checkpoint's state_dict.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from foldmill.kernels.token_rows import by_token_rows, rows_per_block
from foldmill.model.confidence import ConfidenceModule
from foldmill.model.config import Boltz2Config, InferenceRecipe
from foldmill.model.contact_conditioning import ContactConditioning
from foldmill.model.diffusion import AtomDiffusion, ScoreCall
from foldmill.model.diffusion_conditioning import DiffusionConditioning, DiffusionConditioningOutput
from foldmill.model.heads import BFactorModule, DistogramModule
from foldmill.model.input_embedder import InputEmbedder
from foldmill.model.layers.layer_norm import LayerNorm
from foldmill.model.layers.pairformer import PairformerModule
from foldmill.model.msa_module import MSAModule
from foldmill.model.relative_position import RelativePositionEncoder
from foldmill.model.residual import accumulate
from foldmill.model.template_module import TemplateV2Module
from foldmill.vocab import BOND_TYPES, CONFIDENCE_SCALARS


@dataclass
class TrunkOutput:
    """The trunk's results for a batch of B records."""

    s_inputs: Tensor  # (B, T, token_s)
    s: Tensor  # (B, T, token_s)
    z: Tensor  # (B, T, T, token_z)
    relative_position_encoding: Tensor  # (B, T, T, token_z)


class Boltz2(nn.Module):
    """Boltz-2 structure model (affinity heads not included)."""

    def __init__(self, config: Boltz2Config, provenance: dict[str, str] | None = None) -> None:
        super().__init__()
        self.config = config
        self.provenance = dict(provenance or {"model": "untrained", "weights": "initialisation only"})
        token_s, token_z = config.token_s, config.token_z

        self.input_embedder = InputEmbedder(config)
        self.s_init = nn.Linear(token_s, token_s, bias=False)
        self.z_init_1 = nn.Linear(token_s, token_z, bias=False)
        self.z_init_2 = nn.Linear(token_s, token_z, bias=False)
        self.rel_pos = RelativePositionEncoder(token_z, fix_sym_check=True, cyclic_pos_enc=True)
        self.token_bonds = nn.Linear(1, token_z, bias=False)
        self.token_bonds_type = nn.Embedding(len(BOND_TYPES) + 1, token_z)  # 0 = no bond
        self.contact_conditioning = ContactConditioning(
            token_z, config.conditioning_cutoff_min, config.conditioning_cutoff_max
        )
        self.s_norm = LayerNorm(token_s)
        self.z_norm = LayerNorm(token_z)
        self.s_recycle = nn.Linear(token_s, token_s, bias=False)
        self.z_recycle = nn.Linear(token_z, token_z, bias=False)

        if config.use_templates:
            self.template_module = TemplateV2Module(token_z, **config.template_args())
        self.msa_module = MSAModule(token_z=token_z, token_s=token_s, **config.msa_args())
        self.pairformer_module = PairformerModule(token_s, token_z, **config.pairformer_args())

        self.diffusion_conditioning = DiffusionConditioning(config)
        self.structure_module = AtomDiffusion(config)
        self.distogram_module = DistogramModule(token_z, config.num_bins)
        if config.predict_bfactor:
            self.bfactor_module = BFactorModule(token_s, config.num_bins)
        self.confidence_module = ConfidenceModule(
            token_s,
            token_z,
            pairformer_args=config.confidence_pairformer_args(),
            num_dist_bins=config.confidence_num_dist_bins,
            max_dist=config.confidence_max_dist,
            add_s_to_z_prod=True,
            add_s_input_to_s=True,
            add_z_input_to_z=True,
            bond_type_feature=True,
            confidence_args={
                "num_plddt_bins": config.num_plddt_bins,
                "num_pde_bins": config.num_pde_bins,
                "num_pae_bins": config.num_pae_bins,
                "use_separate_heads": config.confidence_separate_heads,
            },
            fix_sym_check=True,
            cyclic_pos_enc=True,
            conditioning_cutoff_min=config.conditioning_cutoff_min,
            conditioning_cutoff_max=config.conditioning_cutoff_max,
        )

    @classmethod
    def from_checkpoint(cls, path: str | Path, config: Boltz2Config | None = None) -> Boltz2:
        """Load published Boltz-2 weights (see foldmill.model.checkpoint). Raises CheckpointError."""
        from foldmill.model.checkpoint import load_boltz2

        return load_boltz2(path, config)

    # Trunk

    def trunk(
        self, feats: dict[str, Tensor], recycling_steps: int, residual_dtype: torch.dtype | None = None
    ) -> TrunkOutput:
        """Input embedding and `recycling_steps + 1` passes of templates, MSA and pairformer.

        residual_dtype: the dtype s and z are stored in between the blocks (the fast path's bf16 or
        fp32 residual stream); None keeps whatever the computation produces (the fp32 reference).
        """
        s_inputs = self.input_embedder(feats)
        s_init = self.s_init(s_inputs)
        z_init_1, z_init_2 = self.z_init_1(s_inputs), self.z_init_2(s_inputs)
        tokens = s_inputs.shape[1]
        rows = rows_per_block(tokens)

        def relative_positions(block: slice) -> Tensor:
            return self.rel_pos(feats, block)

        def z_init_rows(block: slice) -> Tensor:
            # Per token pair, so by blocks of rows (one block below ~700 tokens): unblocked, the int64
            # one-hots and fp32 temporaries of these embeddings peaked at 108 GiB at 6,000 tokens.
            z = z_init_1[:, block, None] + z_init_2[:, None, :]
            z = z + relative_positions(block)
            z = z + self.token_bonds(feats["token_bonds"][:, block].float())
            z = z + self.token_bonds_type(feats["type_bonds"][:, block].long())
            z = z + self.contact_conditioning(feats, block)
            return z if residual_dtype is None else z.to(residual_dtype)

        if residual_dtype is not None:
            s_init = s_init.to(residual_dtype)
        mask = feats["token_pad_mask"].float()
        pair_mask = mask[:, :, None] * mask[:, None, :]
        s = torch.zeros_like(s_init)
        # Without a template (the featurizer's placeholder has an all-zero mask) the template module's
        # update is exactly zero (a mean over no templates, projected without bias): skipped.
        templates = self.config.use_templates and bool(feats["template_mask"].any())
        z: Tensor | None = None
        for _ in range(recycling_steps + 1):
            s = s_init + self.s_recycle(self.s_norm(s))
            # z_init (and the relative positions in it) is rebuilt for every pass, the same values each
            # time: kept, it and the encoding would hold two more pair tensors through every pass (27 GiB
            # at 6,000 tokens) for a rebuild that costs a few element-wise passes.
            z = accumulate(by_token_rows(z_init_rows, tokens, rows), self._recycled_pair(z, s_init))
            # z is the trunk's own from here: every update adds into its storage
            if templates:
                z = accumulate(z, self.template_module(z, feats, pair_mask))
            # the MSA module returns its own refined z; the trunk's z is added into it
            z = accumulate(self.msa_module(z, s_inputs, feats), z)
            s, z = self.pairformer_module(s, z, mask=mask, pair_mask=pair_mask, in_place=True)
        assert z is not None  # recycling_steps >= 0: at least one pass
        return TrunkOutput(s_inputs, s, z, by_token_rows(relative_positions, tokens, rows))

    def _recycled_pair(self, z: Tensor | None, like: Tensor) -> Tensor:
        """z_recycle(z_norm(z)); on the first pass z is all zeros, whose LayerNorm is its bias in every
        pair: one (token_z) row stands for the whole (B, N, N, token_z) tensor (broadcast when added)."""
        if z is None:
            z = like.new_zeros((1, 1, 1, self.config.token_z))
        return self.z_recycle(self.z_norm(z))

    # Full inference

    @torch.no_grad()
    def predict(self, features: dict[str, Tensor], recipe: InferenceRecipe) -> dict[str, Tensor]:
        """Fold a batch of featurised records; see the module docstring for the outputs."""
        feats = features
        trunk = self.trunk(feats, recipe.recycling_steps)
        out = self.trunk_heads(trunk)
        conditioning = self.diffusion_conditioning(trunk.s, trunk.z, trunk.relative_position_encoding, feats)
        coords = self.sample_structure(trunk, feats, conditioning, recipe)
        out["sample_atom_coords"] = coords
        out.update(self.confidence(trunk, coords, out["pdistogram"], feats, recipe))
        return out

    def trunk_heads(self, trunk: TrunkOutput) -> dict[str, Tensor]:
        """The trunk's s and z with the heads read off them: the distogram and, if predicted, B-factors."""
        out = {"s": trunk.s, "z": trunk.z, "pdistogram": self.distogram_module(trunk.z)}
        if self.config.predict_bfactor:
            out["pbfactor"] = self.bfactor_module(trunk.s)
        return out

    def sample_structure(
        self,
        trunk: TrunkOutput,
        feats: dict[str, Tensor],
        conditioning: DiffusionConditioningOutput,
        recipe: InferenceRecipe,
        score: ScoreCall | None = None,
    ) -> Tensor:
        """The recipe's diffusion samples (B * samples, atoms, 3), seeded by recipe.seed; `score` runs the
        score model (see AtomDiffusion.denoise)."""
        return self.structure_module.sample(
            s_trunk=trunk.s.float(),
            s_inputs=trunk.s_inputs.float(),
            feats=feats,
            conditioning=conditioning,
            num_sampling_steps=recipe.sampling_steps,
            multiplicity=recipe.diffusion_samples,
            max_parallel_samples=recipe.max_parallel_samples,
            generator=sampling_generator(recipe.seed, trunk.s.device),
            score=score,
        )

    def forward(self, features: dict[str, Tensor], recipe: InferenceRecipe) -> dict[str, Tensor]:
        return self.predict(features, recipe)

    def confidence(
        self,
        trunk: TrunkOutput,
        coords: Tensor,
        pdistogram: Tensor,
        feats: dict[str, Tensor],
        recipe: InferenceRecipe,
    ) -> dict[str, Tensor]:
        """Confidence of every sample, at most max_parallel_samples samples at once."""
        batch = trunk.s.shape[0]
        samples = recipe.diffusion_samples
        per_record = coords.view(batch, samples, *coords.shape[1:])
        chunks = []
        for start in range(0, samples, recipe.max_parallel_samples):
            chunk = per_record[:, start : start + recipe.max_parallel_samples]
            chunks.append(
                self.confidence_module(
                    s_inputs=trunk.s_inputs,
                    s=trunk.s,
                    z=trunk.z,
                    x_pred=chunk.reshape(-1, *coords.shape[1:]),
                    feats=feats,
                    pred_distogram_logits=pdistogram[:, :, :, 0],
                    multiplicity=chunk.shape[1],
                )
            )
        return _merge_sample_chunks(chunks, batch, _num_chains(feats))


def sampling_generator(seed: int | None, device: torch.device) -> torch.Generator:
    """The diffusion sampler's random numbers: seeded, or from fresh entropy when seed is None."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


def _num_chains(feats: dict[str, Tensor]) -> int:
    mask = feats["token_pad_mask"].bool()
    return int(feats["asym_id"][mask].max().item()) + 1


def _chain_matrix(pair_chains: dict[Any, dict[Any, Tensor]], num_chains: int, rows: int, like: Tensor) -> Tensor:
    """Chain-keyed {i: {j: (rows,)}} -> dense (rows, C, C); pairs the module did not score stay 0."""
    dense = torch.zeros(rows, num_chains, num_chains, dtype=like.dtype, device=like.device)
    for i, by_chain in pair_chains.items():
        for j, values in by_chain.items():
            dense[:, int(i), int(j)] = values
    return dense


def _merge_sample_chunks(chunks: list[dict[str, Any]], batch: int, num_chains: int) -> dict[str, Tensor]:
    """Confidence outputs of sample chunks -> record-major (B * M, ...) tensors."""

    def record_major(values: list[Tensor]) -> Tensor:
        per_record = [v.view(batch, -1, *v.shape[1:]) for v in values]
        merged = torch.cat(per_record, dim=1)
        return merged.reshape(-1, *merged.shape[2:])

    names = ("plddt", "pae", "pde", *CONFIDENCE_SCALARS)
    out = {name: record_major([chunk[name] for chunk in chunks]) for name in names}
    pair_chains = [
        _chain_matrix(chunk["pair_chains_iptm"], num_chains, chunk["ptm"].shape[0], chunk["ptm"]) for chunk in chunks
    ]
    out["pair_chains_iptm"] = record_major(pair_chains)
    out["chains_ptm"] = torch.diagonal(out["pair_chains_iptm"], dim1=-2, dim2=-1)
    return out
