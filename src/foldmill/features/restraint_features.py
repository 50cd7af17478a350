"""Features read only by Boltz-2's inference potentials (steering with `use_potentials`):
ligand and modified-residue geometry (RDKit distance bounds, chirality, double-bond stereo,
planarity), inter-chain covalent links, symmetric chain pairs and forced pocket/contact pairs.

Atom indices are global (the featurized atom order). Geometry needs RDKit; without it these
tensors are empty and the potentials have nothing to enforce for ligands.
"""

from __future__ import annotations

import numpy as np
import torch

from foldmill.features.constraints import Constraints
from foldmill.features.tokenize import Tokenized
from foldmill.vocab import MOL_TYPE_ID

_EXPLICIT_BOND_TOLERANCE = 0.05  # Å around the covalent-radius sum of a user bond
_FALLBACK_BOND_TOLERANCE = 0.5  # when an element has no tabulated covalent radius


def restraint_features(tokenized: Tokenized, constraints: Constraints) -> dict[str, torch.Tensor]:
    return {
        **_geometry(tokenized, constraints),
        **_chain_pairs(tokenized, constraints),
        **_forced_contacts(tokenized, constraints),
    }


def _geometry(tokenized: Tokenized, constraints: Constraints) -> dict[str, torch.Tensor]:
    parts = {name: [] for name in _GEOMETRY_SHAPES}
    for placed in tokenized.residues:
        residue = placed.residue
        if residue.is_standard or residue.component.mol is None or residue.component.n_atoms == 1:
            continue
        from foldmill.features.rdkit_chem import residue_restraints

        r = residue_restraints(residue.component, tuple(residue.atoms.tolist()))
        offset = placed.atom_start
        for name, value in (
            ("rdkit_bounds_index", r.bounds_index + offset), ("rdkit_bounds_bond_mask", r.bounds_is_bond),
            ("rdkit_bounds_angle_mask", r.bounds_is_angle), ("rdkit_upper_bounds", r.upper_bounds),
            ("rdkit_lower_bounds", r.lower_bounds), ("chiral_atom_index", r.chiral_index + offset),
            ("chiral_reference_mask", r.chiral_is_reference), ("chiral_atom_orientations", r.chiral_is_r),
            ("stereo_bond_index", r.stereo_index + offset), ("stereo_reference_mask", r.stereo_is_reference),
            ("stereo_bond_orientations", r.stereo_is_e), ("planar_bond_index", r.planar_bond_index + offset),
            ("planar_ring_5_index", r.planar_ring5_index + offset),
            ("planar_ring_6_index", r.planar_ring6_index + offset),
        ):  # fmt: skip
            parts[name].append(value)
    _add_user_bond_bounds(tokenized, constraints, parts)
    features = {}
    for name, (width, dtype) in _GEOMETRY_SHAPES.items():
        values = [np.asarray(v) for v in parts[name]]
        if width:
            array = np.concatenate(values).reshape(-1, width) if values else np.zeros((0, width))
            features[name] = torch.from_numpy(array.T.copy()).to(dtype)
        else:
            array = np.concatenate(values) if values else np.zeros(0)
            features[name] = torch.from_numpy(array).to(dtype)
    return features


_GEOMETRY_SHAPES = {
    "rdkit_bounds_index": (2, torch.long), "rdkit_bounds_bond_mask": (0, torch.bool),
    "rdkit_bounds_angle_mask": (0, torch.bool), "rdkit_upper_bounds": (0, torch.float32),
    "rdkit_lower_bounds": (0, torch.float32), "chiral_atom_index": (4, torch.long),
    "chiral_reference_mask": (0, torch.bool), "chiral_atom_orientations": (0, torch.bool),
    "stereo_bond_index": (4, torch.long), "stereo_reference_mask": (0, torch.bool),
    "stereo_bond_orientations": (0, torch.bool), "planar_bond_index": (6, torch.long),
    "planar_ring_5_index": (5, torch.long), "planar_ring_6_index": (6, torch.long),
}  # fmt: skip


def _add_user_bond_bounds(tokenized: Tokenized, constraints: Constraints, parts: dict[str, list]) -> None:
    """Each user bond becomes a distance bound around the covalent-radius sum (once per atom pair)."""
    if not constraints.connections:
        return
    from foldmill.features.rdkit_chem import covalent_bond_length

    seen: set[tuple[int, int]] = set()
    for connection in constraints.connections:
        pair = tuple(sorted((connection.atom_1, connection.atom_2)))
        if pair in seen:
            continue
        seen.add(pair)
        elements = tokenized.atoms.elements
        length, fallback = covalent_bond_length(elements[pair[0]], elements[pair[1]])
        tolerance = _FALLBACK_BOND_TOLERANCE if fallback else _EXPLICIT_BOND_TOLERANCE
        parts["rdkit_bounds_index"].append(np.array([pair]))
        parts["rdkit_bounds_bond_mask"].append([True])
        parts["rdkit_bounds_angle_mask"].append([False])
        parts["rdkit_upper_bounds"].append(np.float32([length + tolerance]))
        parts["rdkit_lower_bounds"].append(np.float32([length - tolerance]))


def _chain_pairs(tokenized: Tokenized, constraints: Constraints) -> dict[str, torch.Tensor]:
    links = [c for c in constraints.connections if c.chain_1 != c.chain_2]
    chains = tokenized.structure.chains
    n = len(chains)
    symmetric = [(i, j) for i in range(n) for j in range(i + 1, n) if chains[i].entity_id == chains[j].entity_id]
    return {
        "connected_chain_index": _pairs([(c.chain_1, c.chain_2) for c in links]),
        "connected_atom_index": _pairs([(c.atom_1, c.atom_2) for c in links]),
        "symmetric_chain_index": _pairs(symmetric),
    }


def _pairs(pairs: list[tuple[int, int]]) -> torch.Tensor:
    return torch.tensor(pairs, dtype=torch.long).reshape(-1, 2).T.contiguous()


def _forced_contacts(tokenized: Tokenized, constraints: Constraints) -> dict[str, torch.Tensor]:
    """Atom pairs of forced pocket and contact constraints; each constraint is one 'union' of pairs."""
    tokens = tokenized.tokens
    is_ligand = tokens.mol_type == MOL_TYPE_ID["ligand"]
    keys = list(zip(tokens.asym_id.tolist(), np.where(is_ligand, tokens.atom_start, tokens.residue_index).tolist()))
    token_atoms = [np.arange(s, s + n) for s, n in zip(tokens.atom_start.tolist(), tokens.atom_count.tolist())]
    groups: list[tuple[np.ndarray, np.ndarray, float]] = []
    for pocket in constraints.pockets:
        if not pocket.force:
            continue
        binder_tokens = np.flatnonzero(tokens.asym_id == pocket.binder)
        binder_atoms = np.concatenate([token_atoms[t] for t in binder_tokens])
        contacts = set(pocket.contacts)
        for index, key in enumerate(keys):
            if key in contacts:
                groups.append((binder_atoms, token_atoms[index], pocket.max_distance))
    for contact in constraints.contacts:
        if contact.force and contact.token_1 in keys and contact.token_2 in keys:
            first, second = keys.index(contact.token_1), keys.index(contact.token_2)
            groups.append((token_atoms[first], token_atoms[second], contact.max_distance))
    pair_index, union_index, thresholds = [], [], []
    for union, (atoms_1, atoms_2, distance) in enumerate(groups):
        grid = np.stack(np.meshgrid(atoms_1, atoms_2, indexing="ij"), axis=0).reshape(2, -1)
        pair_index.append(grid)
        union_index.append(np.full(grid.shape[1], union))
        thresholds.append(np.full(grid.shape[1], distance))
    pairs = np.concatenate(pair_index, axis=1) if groups else np.zeros((2, 0))
    return {
        "contact_pair_index": torch.from_numpy(pairs).long(),
        "contact_union_index": torch.from_numpy(np.concatenate(union_index) if groups else np.zeros(0)).long(),
        "contact_negation_mask": torch.ones(pairs.shape[1], dtype=torch.bool),
        "contact_thresholds": torch.from_numpy(np.concatenate(thresholds) if groups else np.zeros(0)).float(),
    }
