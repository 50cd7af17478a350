"""Per-atom features: reference conformers, atom identity, atom<->token maps, frames, padding.

Randomness follows OSS Boltz-2 so features match for the same seed:
- each residue's reference conformer is drawn from its component's conformers with a numpy
  generator seeded with 42 (OSS hard-codes this seed; with biotite's CCD every component has a
  single conformer, so the draw only matters for a user-supplied `mols` directory);
- each residue's reference coordinates are centred, randomly rotated and translated with a torch
  generator seeded with the featurization seed, drawing exactly what OSS draws from torch's
  global generator (`torch.manual_seed(seed)` right before OSS featurizes gives the same numbers).
  Like OSS, the last residue of the target is not augmented (its loop stops one short).
"""

from __future__ import annotations

import numpy as np
import torch

from foldmill.features.residues import NUCLEIC_BACKBONE, NUM_BACKBONE_CLASSES, PROTEIN_BACKBONE, STANDARD_ATOMS
from foldmill.features.tokenize import Tokenized
from foldmill.vocab import MOL_TYPE_ID, NUM_ATOM_NAME_CHARS, NUM_ELEMENTS, TOKENS

ATOMS_PER_WINDOW = 32  # atom counts are padded to a multiple of the atom-attention query window
CONFORMER_SEED = 42
DISTOGRAM_BINS = 64
_BACKBONE_CLASS = {
    MOL_TYPE_ID["protein"]: {name: 1 + i for i, name in enumerate(PROTEIN_BACKBONE)},
    MOL_TYPE_ID["dna"]: {name: 1 + len(PROTEIN_BACKBONE) + i for i, name in enumerate(NUCLEIC_BACKBONE)},
    MOL_TYPE_ID["rna"]: {name: 1 + len(PROTEIN_BACKBONE) + i for i, name in enumerate(NUCLEIC_BACKBONE)},
}
_FRAME_ATOMS = {
    MOL_TYPE_ID["protein"]: ("N", "CA", "C"),
    MOL_TYPE_ID["dna"]: ("C1'", "C3'", "C4'"),
    MOL_TYPE_ID["rna"]: ("C1'", "C3'", "C4'"),
}


def padded_atom_count(n_atoms: int) -> int:
    return -(-n_atoms // ATOMS_PER_WINDOW) * ATOMS_PER_WINDOW


def atom_features(tokenized: Tokenized, seed: int) -> dict[str, torch.Tensor]:
    tokens, atoms = tokenized.tokens, tokenized.atoms
    n_atoms, n_tokens = len(atoms), len(tokens)
    padded = padded_atom_count(n_atoms)
    coords = np.zeros((n_atoms, 3), dtype=np.float32)  # nothing is known about the structure
    polymer = tokens.mol_type != MOL_TYPE_ID["ligand"]
    frames, frame_mask = _frames(tokenized, coords)
    ref_pos = torch.from_numpy(_reference_positions(tokenized)).float()
    ref_pos = _augment(ref_pos, [(p.atom_start, p.atom_start + len(p.residue.atoms)) for p in tokenized.residues], seed)
    # Without coordinates every token distance is 0: the distogram target is the first bin.
    disto_target = torch.zeros(n_tokens, n_tokens, 1, DISTOGRAM_BINS, dtype=torch.float32)
    disto_target[..., 0] = 1.0
    features = {
        "ref_pos": ref_pos,
        "atom_resolved_mask": torch.ones(n_atoms, dtype=torch.bool),
        "ref_atom_name_chars": _one_hot(_name_chars(atoms.names), NUM_ATOM_NAME_CHARS, padded),
        "ref_element": _one_hot(atoms.elements, NUM_ELEMENTS, padded),
        "ref_charge": torch.from_numpy(atoms.charges).float(),
        "ref_chirality": torch.from_numpy(atoms.chirality),
        "atom_backbone_feat": _one_hot(_backbone_classes(tokenized), NUM_BACKBONE_CLASSES, padded),
        "ref_space_uid": torch.from_numpy(atoms.residue_uid),
        "coords": torch.from_numpy(coords)[None],
        "atom_pad_mask": torch.ones(n_atoms, dtype=torch.float32),
        "atom_to_token": _one_hot(atoms.token, n_tokens, padded),
        "token_to_rep_atom": _one_hot(tokens.disto_atom, padded),
        "r_set_to_rep_atom": _one_hot(tokens.center_atom[polymer], padded),
        "token_to_center_atom": _one_hot(tokens.center_atom, padded),
        "disto_target": disto_target,
        "disto_coords_ensemble": torch.from_numpy(coords[tokens.disto_atom])[None],
        "bfactor": torch.zeros(n_atoms, dtype=torch.float32),
        "plddt": torch.ones(n_atoms, dtype=torch.float32),
        "frames_idx": torch.from_numpy(frames)[None],
        "frame_resolved_mask": torch.from_numpy(frame_mask)[None],
    }
    return _pad_atoms(features, padded - n_atoms)


def _one_hot(index: np.ndarray, num_classes: int, rows: int | None = None) -> torch.Tensor:
    """int64 one-hot of `index` (first axis zero-padded to `rows`), built at its final size."""
    rows = len(index) if rows is None else rows
    matrix = torch.zeros(rows, *index.shape[1:], num_classes, dtype=torch.long)
    matrix[: len(index)].scatter_(-1, torch.from_numpy(index).long().unsqueeze(-1), 1)
    return matrix


def _reference_positions(tokenized: Tokenized) -> np.ndarray:
    """Each residue's reference coordinates from one of its component's conformers."""
    rng = np.random.default_rng(CONFORMER_SEED)
    parts = []
    for placed in tokenized.residues:
        component = placed.residue.component
        conformer = int(rng.choice(np.arange(len(component.conformers))))
        parts.append(component.conformers[conformer][placed.residue.atoms])
    return np.concatenate(parts)


def _augment(ref_pos: torch.Tensor, residues: list[tuple[int, int]], seed: int) -> torch.Tensor:
    """Centre and randomly rotate/translate each residue's reference coordinates (see module doc).

    `residues` are the atom ranges of the residues; every atom counts as resolved.
    """
    generator = torch.Generator().manual_seed(seed)
    for start, end in residues[:-1]:
        coords = ref_pos[start:end][None]
        mask = torch.ones(1, end - start, 1, dtype=torch.bool)
        coords = coords - (coords * mask).sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True)
        rotation = _random_rotation(generator, coords.dtype)
        coords = torch.einsum("bmd,bds->bms", coords, rotation)
        translation = torch.randn(coords[:, 0:1, :].shape, generator=generator, dtype=coords.dtype)
        ref_pos[start:end] = (coords + translation)[0]
    return ref_pos


def _random_rotation(generator: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """A uniformly random rotation (1, 3, 3) from a normalized Gaussian quaternion (real part >= 0)."""
    q = torch.randn((1, 4), generator=generator, dtype=dtype)
    norm = torch.sqrt((q * q).sum(1))
    q = q / torch.where(q[:, 0] < 0, -norm, norm)[:, None]
    r, i, j, k = torch.unbind(q, -1)
    two_s = 2.0 / (q * q).sum(-1)
    matrix = torch.stack(
        (
            1 - two_s * (j * j + k * k), two_s * (i * j - k * r), two_s * (i * k + j * r),
            two_s * (i * j + k * r), 1 - two_s * (i * i + k * k), two_s * (j * k - i * r),
            two_s * (i * k - j * r), two_s * (j * k + i * r), 1 - two_s * (i * i + j * j),
        ),
        -1,
    )  # fmt: skip
    return matrix.reshape(1, 3, 3)


def _name_chars(names: np.ndarray) -> np.ndarray:
    """Atom names as 4 character codes (ASCII - 32, zero-padded)."""
    codes = np.zeros((len(names), 4), dtype=np.int64)
    for index, name in enumerate(names):
        chars = [ord(c) - 32 for c in str(name).strip()]
        codes[index, : len(chars)] = chars
    return codes


def _backbone_classes(tokenized: Tokenized) -> np.ndarray:
    atoms, tokens = tokenized.atoms, tokenized.tokens
    atom_mol_type = tokens.mol_type[atoms.token]
    classes = np.zeros(len(atoms), dtype=np.int64)
    for index, (mol_type, name) in enumerate(zip(atom_mol_type.tolist(), atoms.names.tolist())):
        classes[index] = _BACKBONE_CLASS.get(mol_type, {}).get(name, 0)
    return classes


def _frames(tokenized: Tokenized, coords: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Three atoms spanning each token's local frame (for PAE), and whether the frame is usable.

    Polymer tokens use N-CA-C (C1'-C3'-C4' for nucleotides); ligand atoms use their two nearest
    atoms in the same chain. Every frame is unusable without coordinates (collinearity check).
    """
    tokens, atoms = tokenized.tokens, tokenized.atoms
    frames = np.zeros((len(tokens), 3), dtype=np.int64)
    for t in range(len(tokens)):
        start, count = int(tokens.atom_start[t]), int(tokens.atom_count[t])
        residue_name = tokenized.residues[tokens.residue_uid[t]].residue.name
        names = atoms.names[start : start + count]
        offsets = _frame_offsets(tokens.mol_type[t], TOKENS[tokens.res_type[t]], residue_name, names)
        frames[t] = start + np.array(offsets)
    for asym in np.unique(tokens.asym_id):
        on_chain = np.flatnonzero(tokens.asym_id == asym)
        if tokens.mol_type[on_chain[0]] != MOL_TYPE_ID["ligand"] or len(on_chain) < 3:
            continue
        chain_atoms = tokens.atom_start[on_chain]
        xyz = coords[chain_atoms]
        distances = ((xyz[:, None, :] - xyz[None, :, :]) ** 2).sum(-1) ** 0.5
        nearest = np.argsort(distances, axis=1)
        frames[on_chain] = np.stack([nearest[:, 1], nearest[:, 0], nearest[:, 2]], axis=1) + chain_atoms[0]
    return frames, _non_collinear(coords[frames])


def _frame_offsets(mol_type: int, res_type: str, residue_name: str, names: np.ndarray) -> tuple[int, ...]:
    """Positions of the frame atoms within a polymer token (0, 0, 0 if there is no frame).

    Tokens of class UNK (unknown and modified amino acids) and tokens with fewer than three atoms
    have no frame. Standard residues use the fixed layout; modified nucleotides look the atom
    names up (first match, 0 if absent).
    """
    frame_atoms = _FRAME_ATOMS.get(int(mol_type))
    if frame_atoms is None or len(names) < 3 or res_type == "UNK":
        return 0, 0, 0
    layout = STANDARD_ATOMS.get(residue_name)
    names = list(layout) if layout is not None else names.tolist()
    return tuple(names.index(name) if name in names else 0 for name in frame_atoms)


def _non_collinear(frame_coords: np.ndarray) -> np.ndarray:
    v1 = frame_coords[:, 1] - frame_coords[:, 0]
    v2 = frame_coords[:, 1] - frame_coords[:, 2]
    norm1 = np.linalg.norm(v1, axis=1, keepdims=True)
    norm2 = np.linalg.norm(v2, axis=1, keepdims=True)
    cosine = np.sum(v1 / (norm1 + 1e-6) * (v2 / (norm2 + 1e-6)), axis=1)
    return (np.abs(cosine) < 0.9063) & (norm1[:, 0] > 1e-2) & (norm2[:, 0] > 1e-2)


_PAD_ATOM_AXIS = {
    "ref_pos": 0, "atom_resolved_mask": 0, "ref_charge": 0, "ref_chirality": 0, "ref_space_uid": 0,
    "coords": 1, "atom_pad_mask": 0, "bfactor": 0, "plddt": 0,
}  # the one-hot atom features are built padded


def _pad_atoms(features: dict[str, torch.Tensor], pad: int) -> dict[str, torch.Tensor]:
    if pad == 0:
        return features
    for key, axis in _PAD_ATOM_AXIS.items():
        features[key] = _pad_axis(features[key], axis, pad)
    return features


def _pad_axis(tensor: torch.Tensor, axis: int, pad: int) -> torch.Tensor:
    """`tensor` with `pad` zeros appended along `axis`."""
    shape = list(tensor.shape)
    shape[axis] = pad
    filler = torch.zeros(shape, dtype=tensor.dtype)
    return torch.cat([tensor, filler], dim=axis)
