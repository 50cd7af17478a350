"""One diffusion sample of a Prediction as a gemmi.Structure (the source of the mmCIF and PDB files).

pLDDT goes into the B-factor column on the 0-100 scale, per atom from the atom's token (ligand
atoms are one token each), as Boltz and AlphaFold write it.
"""

from __future__ import annotations

import gemmi
import numpy as np

from foldmill.outputs.layout import Chain
from foldmill.outputs.prediction import Prediction

POLYMER_TYPES = {"protein": gemmi.PolymerType.PeptideL, "dna": gemmi.PolymerType.Dna, "rna": gemmi.PolymerType.Rna}


def build_structure(prediction: Prediction, chains: list[Chain], sample: int, name: str) -> gemmi.Structure:
    """A one-model gemmi.Structure of `sample` with entities, label/auth numbering and pLDDT B-factors."""
    coords = np.round(np.asarray(prediction.coords[sample], dtype=np.float64), 3)  # mmCIF/PDB precision
    atom_bfactors = np.round(np.asarray(prediction.plddt[sample], dtype=np.float64) * 100, 2)[
        np.asarray(prediction.atoms.token_index)
    ]
    atom_names = np.asarray(prediction.atoms.atom_names).astype(str)
    elements = np.asarray(prediction.atoms.elements).astype(str)

    structure = gemmi.Structure()
    structure.name = name
    model = gemmi.Model(1)
    for chain in chains:
        gemmi_chain = gemmi.Chain(chain.chain_id)
        for residue in chain.residues:
            gemmi_residue = gemmi.Residue()
            gemmi_residue.name = residue.name
            gemmi_residue.seqid = gemmi.SeqId(residue.number, " ")
            gemmi_residue.subchain = chain.chain_id
            gemmi_residue.entity_id = chain.entity_id
            if chain.is_polymer:
                gemmi_residue.label_seq = residue.number
                gemmi_residue.entity_type = gemmi.EntityType.Polymer
                gemmi_residue.het_flag = "A"
            else:
                gemmi_residue.entity_type = gemmi.EntityType.NonPolymer
                gemmi_residue.het_flag = "H"
            for atom_index in residue.atoms:
                atom = gemmi.Atom()
                atom.name = atom_names[atom_index]
                atom.element = gemmi.Element(elements[atom_index])
                atom.pos = gemmi.Position(*coords[atom_index])
                atom.b_iso = float(atom_bfactors[atom_index])
                atom.occ = 1.0
                gemmi_residue.add_atom(atom)
            gemmi_chain.add_residue(gemmi_residue)
        model.add_chain(gemmi_chain)
    structure.add_model(model)
    for entity in _entities(chains):
        structure.entities.append(entity)
    structure.assign_serial_numbers()
    return structure


def _entities(chains: list[Chain]) -> list[gemmi.Entity]:
    entities: dict[str, gemmi.Entity] = {}
    for chain in chains:
        entity = entities.get(chain.entity_id)
        if entity is None:
            entity = gemmi.Entity(chain.entity_id)
            if chain.is_polymer:
                entity.entity_type = gemmi.EntityType.Polymer
                entity.polymer_type = POLYMER_TYPES[chain.entity_type]
                entity.full_sequence = [residue.name for residue in chain.residues]
            else:
                entity.entity_type = gemmi.EntityType.NonPolymer
            entities[chain.entity_id] = entity
        entity.subchains = [*entity.subchains, chain.chain_id]
    return list(entities.values())


def pdb_limitation(chains: list[Chain], n_atoms: int) -> str | None:
    """Why this structure cannot be written as PDB, or None if it can."""
    long_ids = [chain.chain_id for chain in chains if len(chain.chain_id) > 2]
    if long_ids:
        return f"chain ids longer than 2 characters ({', '.join(long_ids)}) do not fit the PDB format"
    if n_atoms > 99999:
        return f"{n_atoms} atoms do not fit the PDB format (at most 99999)"
    return None


def pdb_text(structure: gemmi.Structure) -> str:
    """PDB format (B-factor = pLDDT); check `pdb_limitation` first."""
    return structure.make_pdb_string(gemmi.PdbWriteOptions(minimal=False))
