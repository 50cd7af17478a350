"""Atom layout of the standard residues (the 33-class vocabulary's residue types).

A standard residue is one token whose heavy atoms come in a fixed order: the CCD order without
hydrogens and without the leaving atoms of polymer linkage (OXT, OP3, ...). The model learned
this order, so it is part of the checkpoint's contract. Each residue has a *center* atom
(CA / C1') used for token positions and a *distogram* atom (CB, CA for glycine, a base atom
for nucleotides) used for token-pair distances and templates.
"""

from __future__ import annotations

_AMINO_BACKBONE = ("N", "CA", "C", "O")
_RIBOSE = ("P", "OP1", "OP2", "O5'", "C5'", "C4'", "O4'", "C3'", "O3'", "C2'", "O2'", "C1'")
_DEOXYRIBOSE = ("P", "OP1", "OP2", "O5'", "C5'", "C4'", "O4'", "C3'", "O3'", "C2'", "C1'")
_PURINE_A = ("N9", "C8", "N7", "C5", "C6", "N6", "N1", "C2", "N3", "C4")
_PURINE_G = ("N9", "C8", "N7", "C5", "C6", "O6", "N1", "C2", "N2", "N3", "C4")
_PYRIMIDINE_C = ("N1", "C2", "O2", "N3", "C4", "N4", "C5", "C6")
_PYRIMIDINE_U = ("N1", "C2", "O2", "N3", "C4", "O4", "C5", "C6")
_PYRIMIDINE_T = ("N1", "C2", "O2", "N3", "C4", "O4", "C5", "C7", "C6")

STANDARD_ATOMS: dict[str, tuple[str, ...]] = {
    "ALA": (*_AMINO_BACKBONE, "CB"),
    "ARG": (*_AMINO_BACKBONE, "CB", "CG", "CD", "NE", "CZ", "NH1", "NH2"),
    "ASN": (*_AMINO_BACKBONE, "CB", "CG", "OD1", "ND2"),
    "ASP": (*_AMINO_BACKBONE, "CB", "CG", "OD1", "OD2"),
    "CYS": (*_AMINO_BACKBONE, "CB", "SG"),
    "GLN": (*_AMINO_BACKBONE, "CB", "CG", "CD", "OE1", "NE2"),
    "GLU": (*_AMINO_BACKBONE, "CB", "CG", "CD", "OE1", "OE2"),
    "GLY": _AMINO_BACKBONE,
    "HIS": (*_AMINO_BACKBONE, "CB", "CG", "ND1", "CD2", "CE1", "NE2"),
    "ILE": (*_AMINO_BACKBONE, "CB", "CG1", "CG2", "CD1"),
    "LEU": (*_AMINO_BACKBONE, "CB", "CG", "CD1", "CD2"),
    "LYS": (*_AMINO_BACKBONE, "CB", "CG", "CD", "CE", "NZ"),
    "MET": (*_AMINO_BACKBONE, "CB", "CG", "SD", "CE"),
    "PHE": (*_AMINO_BACKBONE, "CB", "CG", "CD1", "CD2", "CE1", "CE2", "CZ"),
    "PRO": (*_AMINO_BACKBONE, "CB", "CG", "CD"),
    "SER": (*_AMINO_BACKBONE, "CB", "OG"),
    "THR": (*_AMINO_BACKBONE, "CB", "OG1", "CG2"),
    "TRP": (*_AMINO_BACKBONE, "CB", "CG", "CD1", "CD2", "NE1", "CE2", "CE3", "CZ2", "CZ3", "CH2"),
    "TYR": (*_AMINO_BACKBONE, "CB", "CG", "CD1", "CD2", "CE1", "CE2", "CZ", "OH"),
    "VAL": (*_AMINO_BACKBONE, "CB", "CG1", "CG2"),
    "UNK": (*_AMINO_BACKBONE, "CB"),
    "A": (*_RIBOSE, *_PURINE_A),
    "G": (*_RIBOSE, *_PURINE_G),
    "C": (*_RIBOSE, *_PYRIMIDINE_C),
    "U": (*_RIBOSE, *_PYRIMIDINE_U),
    "N": _RIBOSE,
    "DA": (*_DEOXYRIBOSE, *_PURINE_A),
    "DG": (*_DEOXYRIBOSE, *_PURINE_G),
    "DC": (*_DEOXYRIBOSE, *_PYRIMIDINE_C),
    "DT": (*_DEOXYRIBOSE, *_PYRIMIDINE_T),
    "DN": _DEOXYRIBOSE,
}

_NUCLEOTIDE_DISTO = {"A": "C4", "G": "C4", "C": "C2", "U": "C2", "T": "C2", "N": "C1'"}


def center_atom(residue: str) -> str:
    """The atom whose position stands for the token (CA for amino acids, C1' for nucleotides)."""
    return "CA" if "CA" in STANDARD_ATOMS[residue] else "C1'"


def disto_atom(residue: str) -> str:
    """The atom used for distogram and template distances (CB; CA for glycine; a base atom)."""
    if "CA" in STANDARD_ATOMS[residue]:
        return "CA" if residue == "GLY" else "CB"
    return _NUCLEOTIDE_DISTO[residue.removeprefix("D")]


# Backbone atom classes of the `atom_backbone_feat` one-hot: 0 = not backbone, then the protein
# backbone atoms, then the nucleic-acid backbone atoms (O2' included).
PROTEIN_BACKBONE = _AMINO_BACKBONE
NUCLEIC_BACKBONE = _RIBOSE
NUM_BACKBONE_CLASSES = 1 + len(PROTEIN_BACKBONE) + len(NUCLEIC_BACKBONE)
