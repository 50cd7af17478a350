"""The chain/entity/residue layout of a Prediction, shared by the mmCIF, PDB and summary writers.

Chains keep the order of first appearance in `token_chain_ids` (the index order Boltz uses for
chains_ptm and pair_chains_iptm). Chains with the same type, sequence and residues share one
entity, numbered from "1" in order of first appearance, as in PDB entries.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from foldmill.outputs.prediction import Prediction


@dataclass(frozen=True)
class Residue:
    number: int  # 1-based within the chain
    name: str  # CCD code
    atoms: np.ndarray  # atom indices into Prediction.coords
    tokens: np.ndarray  # distinct token indices of those atoms


@dataclass(frozen=True)
class Chain:
    index: int  # position in Prediction.chain_order: the key of chains_ptm
    chain_id: str
    entity_type: str  # protein|dna|rna|ligand
    entity_id: str
    sequence: str  # one-letter sequence (polymers) or CCD code / SMILES (ligands)
    residues: tuple[Residue, ...]

    @property
    def is_polymer(self) -> bool:
        return self.entity_type != "ligand"

    @property
    def n_tokens(self) -> int:
        return sum(len(residue.tokens) for residue in self.residues)


def chain_layout(prediction: Prediction) -> list[Chain]:
    """Chains with their entities and residues; the prediction must have passed validation."""
    atoms = prediction.atoms
    chain_ids = np.asarray(atoms.chain_ids).astype(str)
    residue_numbers = np.asarray(atoms.residue_numbers).astype(int)
    residue_names = np.asarray(atoms.residue_names).astype(str)
    token_index = np.asarray(atoms.token_index).astype(int)
    entity_ids: dict[tuple, str] = {}
    chains = []
    for index, chain_id in enumerate(prediction.chain_order):
        in_chain = np.flatnonzero(chain_ids == chain_id)
        # Validation guarantees each residue is one contiguous run of atoms.
        starts = np.flatnonzero(np.diff(residue_numbers[in_chain])) + 1
        residues = [
            Residue(
                int(residue_numbers[members[0]]),
                str(residue_names[members[0]]),
                members,
                np.unique(token_index[members]),
            )
            for members in np.split(in_chain, starts)
        ]
        entity_type = str(atoms.entity_types[in_chain[0]])
        sequence = str(prediction.sequences[chain_id])
        key = (entity_type, sequence, tuple(residue.name for residue in residues))
        entity_id = entity_ids.setdefault(key, str(len(entity_ids) + 1))
        chains.append(Chain(index, chain_id, entity_type, entity_id, sequence, tuple(residues)))
    return chains
