"""Helpers shared by the trunk and confidence oracle tests (this file holds no tests).

The oracle is OSS Boltz-2 (boltz-community): its module and ours get the same seeded
random weights (OSS's state_dict loaded into ours with strict=True) and the same inputs.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

TOLERANCE = 1e-5  # relative: max |ours - oss| / max |oss|


def randomize_(module: nn.Module, seed: int) -> nn.Module:
    """Overwrite every parameter with seeded random values of a sensible scale.

    Boltz's own init zeroes many output projections and gates, which would make most
    outputs trivially equal; random values exercise every weight.
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in module.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if param.dim() >= 2:
                param.copy_(noise / math.sqrt(param.shape[-1]))
            elif name.endswith("weight"):  # LayerNorm scale
                param.copy_(1.0 + 0.2 * noise)
            else:
                param.copy_(0.2 * noise)
    return module.eval()


def load_into(ours: nn.Module, oss: nn.Module) -> nn.Module:
    """Load OSS's state_dict into ours with strict=True (names and shapes must match)."""
    ours.load_state_dict(oss.state_dict(), strict=True)
    return ours.eval()


def relative_error(ours: Tensor, oss: Tensor) -> float:
    """max |ours - oss| / max |oss| over finite entries; NaN positions must agree."""
    assert ours.shape == oss.shape, (ours.shape, oss.shape)
    ours, oss = ours.double(), oss.double()
    nan = torch.isnan(oss)
    assert torch.equal(torch.isnan(ours), nan), "NaN positions differ"
    ours, oss = ours[~nan], oss[~nan]
    if oss.numel() == 0:
        return 0.0
    scale = oss.abs().max().clamp_min(1e-12)
    return float((ours - oss).abs().max() / scale)


def assert_matches(ours, oss, tolerance: float = TOLERANCE, where: str = "output") -> float:
    """Compare tensors or (nested) dicts / tuples of tensors; returns the worst relative error."""
    if isinstance(oss, dict):
        assert set(ours) >= set(oss), f"{where}: missing keys {set(oss) - set(ours)}"
        return max((assert_matches(ours[k], oss[k], tolerance, f"{where}[{k}]") for k in oss), default=0.0)
    if isinstance(oss, (tuple, list)):
        assert len(ours) == len(oss), where
        pairs = enumerate(zip(ours, oss, strict=True))
        return max((assert_matches(a, b, tolerance, f"{where}[{i}]") for i, (a, b) in pairs), default=0.0)
    assert ours.dtype == oss.dtype or (ours.is_floating_point() and oss.is_floating_point()), where
    error = relative_error(ours, oss)
    assert error <= tolerance, f"{where}: relative error {error:.3g} > {tolerance:g}"
    return error


def token_masks(batch: int, tokens: int, padding: int) -> tuple[Tensor, Tensor]:
    """(B, N) token mask with the last `padding` tokens padded, and its (B, N, N) pair mask."""
    mask = torch.ones(batch, tokens)
    if padding:
        mask[:, tokens - padding :] = 0
    return mask, mask[:, :, None] * mask[:, None, :]


def random_rotations(count: int, generator: torch.Generator) -> Tensor:
    q, r = torch.linalg.qr(torch.randn(count, 3, 3, generator=generator))
    q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)
    return q * torch.det(q)[:, None, None]  # proper rotations


def complex_features(seed: int = 0, cyclic: bool = False) -> dict[str, Tensor]:
    """Token/atom features of a small complex: protein A (5 residues), protein B (4, same entity),
    a 4-atom ligand C, a 1-atom ion D, and 3 padding tokens; 3 atoms per residue (N, CA, C).
    Batch of 1, as in inference. Layout and dtypes follow Boltz-2's featurizer."""
    g = torch.Generator().manual_seed(seed)
    chains = [  # (asym, entity, sym, residues, mol_type, atoms per token)
        (0, 0, 0, 5, 0, 3),
        (1, 0, 1, 4, 0, 3),
        (2, 1, 0, 4, 3, 1),  # ligand: one token per atom, all in residue 0
        (3, 2, 0, 1, 3, 1),
    ]
    n_real = sum(c[3] for c in chains)
    n_tokens, n_atoms = n_real + 3, 64
    f = {
        k: torch.zeros(1, n_tokens, dtype=torch.long)
        for k in ("asym_id", "entity_id", "sym_id", "residue_index", "token_index", "mol_type")
    }
    f["token_pad_mask"] = torch.zeros(1, n_tokens)
    f["cyclic_period"] = torch.zeros(1, n_tokens)
    f["atom_to_token"] = torch.zeros(1, n_atoms, n_tokens, dtype=torch.long)
    f["token_to_rep_atom"] = torch.zeros(1, n_tokens, n_atoms, dtype=torch.long)
    f["frames_idx"] = torch.zeros(1, 1, n_tokens, 3, dtype=torch.long)
    f["atom_pad_mask"] = torch.zeros(1, n_atoms)
    token = atom = 0
    for asym, entity, sym, length, mol_type, per_token in chains:
        for position in range(length):
            f["asym_id"][0, token], f["entity_id"][0, token], f["sym_id"][0, token] = asym, entity, sym
            f["residue_index"][0, token] = position if mol_type == 0 else 0
            f["token_index"][0, token] = token
            f["mol_type"][0, token] = mol_type
            f["token_pad_mask"][0, token] = 1
            if cyclic and asym == 0:
                f["cyclic_period"][0, token] = length
            f["atom_to_token"][0, atom : atom + per_token, token] = 1
            f["atom_pad_mask"][0, atom : atom + per_token] = 1
            rep = atom + per_token // 2
            f["token_to_rep_atom"][0, token, rep] = 1
            f["frames_idx"][0, 0, token] = torch.tensor([atom, rep, atom + per_token - 1])
            token, atom = token + 1, atom + per_token

    bonds = (torch.rand(1, n_tokens, n_tokens, generator=g) < 0.1).float()
    f["token_bonds"] = ((bonds + bonds.transpose(1, 2)) > 0).float().unsqueeze(-1)
    f["type_bonds"] = torch.randint(0, 7, (1, n_tokens, n_tokens), generator=g) * f["token_bonds"][..., 0].long()
    classes = torch.zeros(1, n_tokens, n_tokens, dtype=torch.long)  # UNSPECIFIED
    classes[:, :4, 9:13] = 2  # pocket residues -> ligand binder
    classes[:, 9:13, :4] = 3
    classes[:, 5:7, 0:2] = 4  # contact
    classes[:, 7, :] = 1  # unselected
    f["contact_conditioning"] = torch.nn.functional.one_hot(classes, 5)
    f["contact_threshold"] = 4 + 16 * torch.rand(1, n_tokens, n_tokens, generator=g)
    return f


def predicted_coords(features: dict[str, Tensor], samples: int, seed: int = 1) -> Tensor:
    """(samples, M, 3) coordinates: polymer atoms along a compact random walk, so that some
    tokens of different chains are within 8 A; padded atoms at the origin."""
    g = torch.Generator().manual_seed(seed)
    n_atoms = features["atom_pad_mask"].shape[1]
    steps = torch.randn(samples, n_atoms, 3, generator=g) * 1.5
    coords = torch.cumsum(steps, dim=1)
    coords = coords - coords.mean(dim=1, keepdim=True)
    return coords * features["atom_pad_mask"][0, :, None]
