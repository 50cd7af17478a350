"""Read the protein chains of a template structure (mmCIF, PDB; .gz too) with gemmi.

Each chain is described over its full sequence (the entity sequence in mmCIF, SEQRES in PDB,
else the observed residues), so unresolved residues keep their place and the query aligns to
what the chain is, not only to what was resolved. The first model and the first alternative
conformation are used; hydrogens are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gemmi
import numpy as np

from foldmill.errors import InputError
from foldmill.templates.types import BACKBONE_ATOMS

STRUCTURE_SUFFIXES = (".cif", ".cif.gz", ".mmcif", ".pdb", ".pdb.gz", ".ent", ".ent.gz")
_PROTEIN = (gemmi.PolymerType.PeptideL, gemmi.PolymerType.PeptideD)


@dataclass
class TemplateChain:
    chain_id: str
    sequence: str  # one-letter codes of the full sequence ('X' = unknown)
    residue_names: list[str]  # CCD names, one per sequence position
    coords: np.ndarray  # (n, 4, 3) float32, N CA C CB per sequence position
    atom_mask: np.ndarray  # (n, 4) bool, False for unresolved atoms and residues


@dataclass
class TemplateStructure:
    path: str
    structure_id: str  # file name without suffixes, e.g. "1aki"
    release_date: str  # YYYY-MM-DD, "" if unknown
    chains: dict[str, TemplateChain]  # protein chains by author chain id


def structure_id(path: str | Path) -> str:
    name = Path(path).name
    for suffix in sorted(STRUCTURE_SUFFIXES, key=len, reverse=True):
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return Path(path).stem


def one_letter(residue_name: str) -> str:
    """One-letter code of a residue (modified residues give their parent's, e.g. MSE -> M)."""
    info = gemmi.find_tabulated_residue(residue_name)
    if info is None or not info.is_amino_acid():
        return "X"
    code = info.one_letter_code.upper()
    return code if code.isalpha() and code != " " else "X"


def read_template(path: str | Path) -> TemplateStructure:
    """Parse the protein chains of a structure file; InputError naming the file if it cannot."""
    path = Path(path)
    try:
        if path.name.lower().endswith((".cif", ".cif.gz", ".mmcif")):
            block = gemmi.cif.read(str(path)).sole_block()
            structure = gemmi.make_structure_from_block(block)
            release_date = _release_date(block)
        else:
            structure = gemmi.read_structure(str(path))
            release_date = ""
    except (RuntimeError, ValueError, OSError) as error:
        raise InputError(str(path), None, f"cannot read template structure: {error}") from None
    if len(structure) == 0:
        raise InputError(str(path), None, "template structure has no model")
    structure.setup_entities()
    structure.remove_alternative_conformations()
    structure.remove_hydrogens()
    chains: dict[str, TemplateChain] = {}
    for chain in structure[0]:
        polymer = chain.get_polymer()
        if chain.name in chains or len(polymer) == 0:
            continue
        if polymer.check_polymer_type() not in _PROTEIN:
            continue
        chains[chain.name] = _read_chain(structure, chain.name, polymer)
    return TemplateStructure(str(path), structure_id(path), release_date, chains)


def _release_date(block: gemmi.cif.Block) -> str:
    dates = [
        d for d in block.find_values("_pdbx_audit_revision_history.revision_date") if gemmi.cif.is_null(d) is False
    ]
    return min(gemmi.cif.as_string(d) for d in dates) if dates else ""


def _read_chain(structure: gemmi.Structure, chain_id: str, polymer: gemmi.ResidueSpan) -> TemplateChain:
    entity = structure.get_entity_of(polymer)
    full = [gemmi.Entity.first_mon(name) for name in entity.full_sequence] if entity else []
    numbered = bool(full) and all(
        r.label_seq is not None and 1 <= r.label_seq <= len(full) and full[r.label_seq - 1] == r.name for r in polymer
    )
    names = full if numbered else [r.name for r in polymer]
    coords = np.zeros((len(names), len(BACKBONE_ATOMS), 3), dtype=np.float32)
    mask = np.zeros((len(names), len(BACKBONE_ATOMS)), dtype=bool)
    for order, residue in enumerate(polymer):
        position = residue.label_seq - 1 if numbered else order
        for slot, atom_name in enumerate(BACKBONE_ATOMS):
            atom = residue.find_atom(atom_name, "*")
            if atom is not None:
                coords[position, slot] = (atom.pos.x, atom.pos.y, atom.pos.z)
                mask[position, slot] = True
    sequence = "".join(one_letter(name) for name in names)
    return TemplateChain(chain_id, sequence, names, coords, mask)
