"""Confidence metrics from the confidence heads' logits, computed as Boltz-2 computes them.

All functions are plain tensor code on a batch of BM = B * multiplicity samples of N
tokens; `feats` are the model's input features (batch B), repeated per sample here.
- expected_value: binned logits -> expected bin centre (pLDDT in [0, 1], PAE/PDE in A).
- plddt_summaries: complex pLDDT and interface-weighted complex ipLDDT.
- contact_weighted_pair_masks / pde_summaries / pae_summaries: summaries weighted by the
  predicted contact probability (trunk distogram mass below ~8 A).
- unweighted_pae_summaries: plain means over valid pairs.
- frame_mask: tokens whose (predicted) frame is usable for pTM; ligand frames are rebuilt
  from nearest neighbours in the prediction.
- tm_scores: pTM, ipTM, ligand/protein ipTM, pair-chain ipTM (its diagonal is per-chain pTM).
- confidence_score: the ranking score (4 * complex pLDDT + (ipTM or pTM)) / 5.
Chain-keyed results are dicts {asym_id: tensor (BM,)}.

Per-pair reductions over bins (softmax expectations of the (BM, N, N, 64) PAE/PDE/distogram
logits) run by blocks of token rows (foldmill.kernels.token_rows): under autocast the softmax is
fp32, two (N, N, 64) fp32 temporaries of 8.6 GiB each at 6,000 tokens; same values per pair.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from foldmill.kernels.token_rows import by_token_rows, rows_per_block
from foldmill.vocab import MOL_TYPE_ID

PROTEIN = MOL_TYPE_ID["protein"]
NONPOLYMER = MOL_TYPE_ID["ligand"]

# complex ipLDDT token weights
LIGAND_WEIGHT = 20.0
INTERFACE_WEIGHT = 10.0
NON_INTERFACE_WEIGHT = 1.0
CONTACT_DISTANCE = 8.0  # A, between representative atoms
CONTACT_BINS = 20  # distogram bins counted as contact (64 bins over 2-22 A: below ~8.1 A)
COLLINEAR_COSINE = 0.9063  # a frame's bond vectors must be 25-155 degrees apart (|cos| below this)


def _repeat(feature: Tensor, multiplicity: int) -> Tensor:
    return feature.repeat_interleave(multiplicity, 0)


def _over_bins_by_rows(logits: Tensor, reduce: Callable[[Tensor], Tensor]) -> Tensor:
    """reduce(logits block) for blocks of token rows (dim 1) of binned logits (BM, N, ..., bins)."""
    pairs_per_row = math.prod(logits.shape[2:-1])
    return by_token_rows(lambda rows: reduce(logits[:, rows]), logits.shape[1], rows_per_block(pairs_per_row))


def expected_value(logits: Tensor, end: float = 1.0) -> Tensor:
    """Expectation of the bin centres (end / bins * (k + 1/2)) under softmax(logits)."""
    num_bins = logits.shape[-1]
    bin_width = end / num_bins
    centres = torch.arange(start=0.5 * bin_width, end=end, step=bin_width, device=logits.device)
    return _over_bins_by_rows(logits, lambda block: torch.sum(block.softmax(dim=-1) * centres, dim=-1))


def _weighted_mean_or_nan(values: Tensor, weights: Tensor, dims: tuple[int, ...]) -> Tensor:
    weight_sum = weights.sum(dim=dims)
    mean = (values * weights).sum(dim=dims) / torch.clamp(weight_sum, min=1e-10)
    return torch.where(weight_sum > 0, mean, torch.full_like(mean, torch.nan))


def _chain_ids(asym_id: Tensor) -> list[int]:
    return torch.unique(asym_id).tolist()


def plddt_summaries(
    plddt: Tensor, rep_distances: Tensor, feats: dict[str, Tensor], multiplicity: int
) -> tuple[Tensor, Tensor]:
    """complex pLDDT (mean over tokens) and complex ipLDDT (ligand and interface tokens up-weighted).

    An interface token is a non-ligand token within CONTACT_DISTANCE of a token of another chain.
    As in Boltz-2, padding tokens take part as chain-0 tokens at the origin.
    """
    pad = _repeat(feats["token_pad_mask"], multiplicity)
    complex_plddt = (plddt * pad).sum(dim=-1) / pad.sum(dim=-1)

    is_ligand = (_repeat(feats["mol_type"], multiplicity) == NONPOLYMER).float()
    asym_id = feats["asym_id"]
    other_chain = _repeat((asym_id.unsqueeze(-1) != asym_id.unsqueeze(-2)).float(), multiplicity)
    contact = (rep_distances < CONTACT_DISTANCE).float()
    interface = torch.max(contact * other_chain * (1 - is_ligand).unsqueeze(-1), dim=-1).values
    non_interface = (1 - interface) * (1 - is_ligand)
    weight = is_ligand * LIGAND_WEIGHT + interface * INTERFACE_WEIGHT + non_interface * NON_INTERFACE_WEIGHT
    complex_iplddt = (plddt * pad * weight).sum(dim=-1) / torch.sum(pad * weight, dim=-1)
    return complex_plddt, complex_iplddt


def contact_weighted_pair_masks(
    distogram_logits: Tensor, feats: dict[str, Tensor], multiplicity: int
) -> tuple[Tensor, Tensor]:
    """Off-diagonal token pairs weighted by predicted contact probability: (all pairs, inter-chain pairs)."""
    contact_bins = min(CONTACT_BINS, distogram_logits.shape[-1])
    contact_prob = _repeat(
        _over_bins_by_rows(distogram_logits, lambda block: block.softmax(dim=-1)[..., :contact_bins].sum(-1)),
        multiplicity,
    )
    pad = _repeat(feats["token_pad_mask"], multiplicity).float()
    off_diagonal = 1 - torch.eye(pad.shape[1], device=pad.device).unsqueeze(0)
    pair = pad.unsqueeze(-1) * pad.unsqueeze(-2) * off_diagonal * contact_prob
    asym_id = _repeat(feats["asym_id"], multiplicity)
    return pair, pair * (asym_id.unsqueeze(-1) != asym_id.unsqueeze(-2))


def pde_summaries(pde: Tensor, pair: Tensor, interface_pair: Tensor) -> tuple[Tensor, Tensor]:
    """complex PDE and complex iPDE: contact-weighted means of the PDE."""
    complex_pde = (pde * pair).sum(dim=(1, 2)) / pair.sum(dim=(1, 2))
    complex_ipde = (pde * interface_pair).sum(dim=(1, 2)) / (interface_pair.sum(dim=(1, 2)) + 1e-5)
    return complex_pde, complex_ipde


def pae_summaries(
    pae: Tensor, pair: Tensor, interface_pair: Tensor, feats: dict[str, Tensor], multiplicity: int
) -> tuple[Tensor, Tensor, dict, dict]:
    """Means of the PAE under the given pair weights (contact-weighted in Boltz-2's complex_pae):
    complex, interface, per chain, per chain pair (i in c1, j in c2).

    Chain keys are the asym_ids of present tokens; a mean without any weight is NaN.
    """
    pad = _repeat(feats["token_pad_mask"], multiplicity)
    asym_id = _repeat(feats["asym_id"], multiplicity)
    chains = _chain_ids(asym_id[pad.bool()])
    pair_chains = {}
    for chain1 in chains:
        rows = (asym_id.unsqueeze(-1) == chain1).to(pair.dtype)
        pair_chains[chain1] = {
            chain2: _weighted_mean_or_nan(pae, pair * rows * (asym_id.unsqueeze(-2) == chain2).to(pair.dtype), (1, 2))
            for chain2 in chains
        }
    return (
        _weighted_mean_or_nan(pae, pair, (1, 2)),
        _weighted_mean_or_nan(pae, interface_pair, (1, 2)),
        {chain: pair_chains[chain][chain] for chain in chains},
        pair_chains,
    )


def unweighted_pae_summaries(
    pae: Tensor, frames: Tensor, feats: dict[str, Tensor], multiplicity: int
) -> tuple[Tensor, Tensor, dict, dict]:
    """Plain-mean complex PAE, complex iPAE, per-chain and pair-chain PAE.

    Pairs (i, j): both tokens present, i != j, token i (the aligned frame) with a valid frame.
    """
    pad = _repeat(feats["token_pad_mask"], multiplicity).float()
    asym_id = _repeat(feats["asym_id"], multiplicity)
    frames = frames.reshape(-1, frames.shape[-1]).float()
    off_diagonal = 1 - torch.eye(pad.shape[1], device=pae.device, dtype=pae.dtype).unsqueeze(0)
    pair = (frames * pad).unsqueeze(-1) * pad.unsqueeze(-2) * off_diagonal
    interface_pair = pair * (asym_id.unsqueeze(-1) != asym_id.unsqueeze(-2))
    return pae_summaries(pae, pair, interface_pair, feats, multiplicity)


def _ligand_frames(coords: Tensor, first_atom: int) -> Tensor:
    """Frames of a ligand chain's atoms (S, A, 3) from the prediction: (nearest neighbour, atom, second nearest)."""
    distances = ((coords[:, None, :, :] - coords[:, :, None, :]) ** 2).sum(-1) ** 0.5
    order = torch.sort(distances, dim=2).indices  # order[..., 0] is the atom itself
    return torch.cat([order[:, :, 1:2], order[:, :, 0:1], order[:, :, 2:3]], dim=2) + first_atom


def _usable_frames(frame_atoms: Tensor) -> Tensor:
    """(F, 3, 3) frame atom coordinates -> (F,) bool: both bond vectors longer than 0.01 A and not collinear."""
    v1 = frame_atoms[:, 1] - frame_atoms[:, 0]
    v2 = frame_atoms[:, 1] - frame_atoms[:, 2]
    norm1 = torch.norm(v1, dim=1, keepdim=True)
    norm2 = torch.norm(v2, dim=1, keepdim=True)
    cosine = torch.sum((v1 / (norm1 + 1e-6)) * (v2 / (norm2 + 1e-6)), dim=1)
    return (torch.abs(cosine) < COLLINEAR_COSINE) & (norm1.reshape(-1) > 1e-2) & (norm2.reshape(-1) > 1e-2)


def frame_mask(coords: Tensor, feats: dict[str, Tensor], multiplicity: int) -> Tensor:
    """(B, multiplicity, N) mask of tokens with a usable frame in the predicted coords (BM, M, 3).

    Polymer tokens use their backbone frame (feats["frames_idx"]); ligand chains of at
    least 3 atoms get frames from nearest neighbours in each predicted sample. Chains and
    their atoms are assumed laid out in asym_id order, as the featurizer writes them.
    """
    num_samples = coords.shape[0]
    batch = num_samples // multiplicity
    coords = coords.reshape(batch, multiplicity, -1, 3)
    frames = _repeat(feats["frames_idx"].clone(), multiplicity).reshape(batch, multiplicity, -1, 3)
    asym_id = feats["asym_id"]
    atom_asym_id = torch.bmm(feats["atom_to_token"].float(), asym_id.unsqueeze(-1).float()).squeeze(-1)

    for item in range(batch):
        token_start = atom_start = 0
        for chain in torch.unique(asym_id[item]):
            chain_tokens = (asym_id[item] == chain) * feats["token_pad_mask"][item]
            chain_atoms = ((atom_asym_id[item] == chain) * feats["atom_pad_mask"][item]).bool()
            num_tokens = int(chain_tokens.sum().item())
            num_atoms = int(chain_atoms.sum().item())
            if feats["mol_type"][item, token_start] == NONPOLYMER and num_atoms >= 3:
                # one token per ligand atom
                frames[item, :, token_start : token_start + num_atoms] = _ligand_frames(
                    coords[item][:, chain_atoms], atom_start
                )
            token_start += num_tokens
            atom_start += num_atoms

    batch_index = torch.arange(batch, device=frames.device)[:, None, None, None]
    sample_index = torch.arange(multiplicity, device=frames.device)[None, :, None, None]
    frame_atoms = coords[batch_index, sample_index, frames].reshape(-1, 3, 3)
    usable = _usable_frames(frame_atoms).reshape(batch, multiplicity, -1)
    return usable * feats["token_pad_mask"][:, None, :]


def _tm_kernel(distance: Tensor, num_residues: Tensor) -> Tensor:
    d0 = 1.24 * (torch.clip(num_residues, min=19) - 15) ** (1 / 3) - 1.8
    return 1 / (1 + (distance / d0) ** 2)


def _max_over_frames(tm: Tensor, pair: Tensor) -> Tensor:
    """max over aligned frames i of the mean TM term over scored tokens j: (BM,)."""
    return torch.max(torch.sum(tm * pair, dim=-1) / (torch.sum(pair, dim=-1) + 1e-5), dim=1).values


def tm_scores(
    pae_logits: Tensor, frames: Tensor, feats: dict[str, Tensor], multiplicity: int
) -> tuple[Tensor, Tensor, Tensor, Tensor, dict]:
    """pTM, ipTM, ligand ipTM, protein ipTM (each (BM,)) and pair-chain ipTM from PAE logits.

    pair_chains[c1][c2]: best frame i on chain c2, scoring the tokens j of chain c1 (as Boltz-2
    keys it); pair_chains[c][c] is chain c's pTM. Chain keys cover every asym_id in the
    input, padding included.
    """
    pad = _repeat(feats["token_pad_mask"], multiplicity)
    asym_id = _repeat(feats["asym_id"], multiplicity)
    frame_ok = frames.reshape(-1, frames.shape[-1])
    valid = frame_ok[:, :, None] * pad[:, None, :] * pad[:, :, None]
    other_chain = asym_id[:, None, :] != asym_id[:, :, None]

    num_bins = pae_logits.shape[-1]
    bin_width = 32.0 / num_bins
    centres = torch.arange(start=0.5 * bin_width, end=32.0, step=bin_width, device=pae_logits.device).unsqueeze(0)
    tm_per_bin = _tm_kernel(centres, pad.sum(dim=-1, keepdim=True)).unsqueeze(1).unsqueeze(2)
    tm = _over_bins_by_rows(pae_logits, lambda block: torch.sum(block.softmax(dim=-1) * tm_per_bin, dim=-1))  # (BM, N, N)

    mol_type = _repeat(feats["mol_type"], multiplicity)
    is_ligand = (mol_type == NONPOLYMER).float()
    is_protein = (mol_type == PROTEIN).float()
    interface = valid * other_chain
    ligand_protein = is_ligand[:, :, None] * is_protein[:, None, :] + is_protein[:, :, None] * is_ligand[:, None, :]
    protein_protein = is_protein[:, :, None] * is_protein[:, None, :]

    pair_chains = {}
    for chain1 in _chain_ids(asym_id):
        pair_chains[chain1] = {
            chain2: _max_over_frames(tm, valid * (asym_id[:, None, :] == chain1) * (asym_id[:, :, None] == chain2))
            for chain2 in _chain_ids(asym_id)
        }
    return (
        _max_over_frames(tm, valid),
        _max_over_frames(tm, interface),
        _max_over_frames(tm, interface * ligand_protein),
        _max_over_frames(tm, interface * protein_protein),
        pair_chains,
    )


def confidence_score(complex_plddt: Tensor, ptm: Tensor, iptm: Tensor) -> Tensor:
    """(4 * complex pLDDT + ipTM) / 5, with pTM instead when ipTM is 0 for every sample (one chain)."""
    interface_score = iptm if not torch.allclose(iptm, torch.zeros_like(iptm)) else ptm
    return (4 * complex_plddt + interface_score) / 5
