"""Tokenization: chains of residues into tokens and a flat atom table.

One token per standard residue and per modified residue (its class is the chain type's unknown
residue, `modified` = 1); one token per heavy atom of a ligand. Atoms are numbered chain by
chain, residue by residue, in each residue's feature order, so the atom axis of every feature and
of the predicted coordinates follows this table.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from foldmill.features.structure import Chain, Residue, Structure
from foldmill.vocab import TOKEN_ID, UNKNOWN_TOKEN_ID


@dataclass
class Tokens:
    """Per-token arrays (n_tokens,)."""

    residue_index: np.ndarray  # 0-based residue position in the chain (0 for ligand atoms)
    asym_id: np.ndarray
    entity_id: np.ndarray
    sym_id: np.ndarray
    mol_type: np.ndarray
    res_type: np.ndarray  # vocabulary class
    modified: np.ndarray
    cyclic_period: np.ndarray
    affinity_mask: np.ndarray
    residue_uid: np.ndarray  # running residue number over the whole target
    atom_start: np.ndarray
    atom_count: np.ndarray
    center_atom: np.ndarray  # global atom index
    disto_atom: np.ndarray  # global atom index

    def __len__(self) -> int:
        return len(self.asym_id)


@dataclass
class AtomTable:
    """Per-atom arrays (n_atoms,)."""

    names: np.ndarray  # str
    symbols: np.ndarray  # str
    elements: np.ndarray
    charges: np.ndarray
    chirality: np.ndarray
    token: np.ndarray  # token index of each atom
    residue_uid: np.ndarray

    def __len__(self) -> int:
        return len(self.names)


@dataclass
class PlacedResidue:
    """A residue of one chain copy and where its atoms sit in the atom table."""

    chain: Chain
    residue: Residue
    uid: int
    atom_start: int


@dataclass
class Tokenized:
    structure: Structure
    tokens: Tokens
    atoms: AtomTable
    residues: list[PlacedResidue]
    bonds: np.ndarray  # (n_bonds, 3): global atom, global atom, BOND_TYPE_ID (residue-internal bonds)


def tokenize(structure: Structure) -> Tokenized:
    token_rows: list[tuple] = []
    atom_parts: list[tuple] = []
    placed: list[PlacedResidue] = []
    bonds: list[np.ndarray] = []
    atom_start = 0
    for chain in structure.chains:
        affinity = chain.name == structure.affinity_chain
        for residue in chain.residues:
            uid = len(placed)
            placed.append(PlacedResidue(chain, residue, uid, atom_start))
            n_atoms = len(residue.atoms)
            base = (residue.index, chain.asym_id, chain.entity_id, chain.sym_id, chain.mol_type)
            tail = (chain.cyclic_period, affinity, uid)
            first_token = len(token_rows)
            if chain.entity_type == "ligand":
                for k in range(n_atoms):
                    atom = atom_start + k
                    token_rows.append((*base, TOKEN_ID["UNK"], False, *tail, atom, 1, atom, atom))
                atom_tokens = np.arange(first_token, first_token + n_atoms)
            else:
                res_type = TOKEN_ID[residue.name] if residue.is_standard else UNKNOWN_TOKEN_ID[chain.entity_type]
                token_rows.append(
                    (*base, res_type, not residue.is_standard, *tail, atom_start, n_atoms,
                     atom_start + residue.center, atom_start + residue.disto)
                )  # fmt: skip
                atom_tokens = np.full(n_atoms, first_token)
            atom_parts.append((residue, atom_tokens, uid))
            if not residue.is_standard:
                bonds.append(_residue_bonds(residue, atom_start))
            atom_start += n_atoms
    columns = list(zip(*token_rows))
    tokens = Tokens(*(np.asarray(column, dtype=np.int64) for column in columns))
    return Tokenized(
        structure=structure,
        tokens=tokens,
        atoms=_atom_table(atom_parts),
        residues=placed,
        bonds=np.concatenate(bonds) if bonds else np.zeros((0, 3), dtype=np.int64),
    )


def _residue_bonds(residue: Residue, atom_start: int) -> np.ndarray:
    """The component's bonds among the kept atoms, in global atom numbers."""
    position = np.full(residue.component.n_atoms, -1, dtype=np.int64)
    position[residue.atoms] = np.arange(len(residue.atoms))
    bonds = residue.component.bonds
    first, second = position[bonds[:, 0]], position[bonds[:, 1]]
    keep = (first >= 0) & (second >= 0)
    low, high = np.minimum(first[keep], second[keep]), np.maximum(first[keep], second[keep])
    return np.stack([low + atom_start, high + atom_start, bonds[keep, 2]], axis=1)


def _atom_table(parts: list[tuple]) -> AtomTable:
    def gather(field: str) -> np.ndarray:
        return np.concatenate([np.asarray(getattr(r.component, field))[r.atoms] for r, _, _ in parts])

    return AtomTable(
        names=gather("atom_names"),
        symbols=gather("symbols"),
        elements=gather("elements"),
        charges=gather("charges"),
        chirality=gather("chirality"),
        token=np.concatenate([tokens for _, tokens, _ in parts]).astype(np.int64),
        residue_uid=np.concatenate([np.full(len(r.atoms), uid, dtype=np.int64) for r, _, uid in parts]),
    )

