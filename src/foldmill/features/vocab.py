"""The Boltz-2 residue-type vocabulary (33 classes) and one-letter code maps.

Class order is part of the checkpoint's contract (embedding rows), so it must not change.
"""

from __future__ import annotations

PROTEIN_RESIDUES = (
    "ALA", "ARG", "ASN", "ASP", "CYS", "GLN", "GLU", "GLY", "HIS", "ILE",
    "LEU", "LYS", "MET", "PHE", "PRO", "SER", "THR", "TRP", "TYR", "VAL", "UNK",
)  # fmt: skip
RNA_RESIDUES = ("A", "G", "C", "U", "N")
DNA_RESIDUES = ("DA", "DG", "DC", "DT", "DN")
TOKENS = ("<pad>", "-", *PROTEIN_RESIDUES, *RNA_RESIDUES, *DNA_RESIDUES)
NUM_TOKENS = len(TOKENS)  # 33
TOKEN_ID = {name: index for index, name in enumerate(TOKENS)}
GAP_ID = TOKEN_ID["-"]

# One-letter codes per polymer type; anything else in a chain is unknown (UNK / N / DN).
PROTEIN_LETTERS = {
    "A": "ALA", "R": "ARG", "N": "ASN", "D": "ASP", "C": "CYS", "E": "GLU", "Q": "GLN", "G": "GLY",
    "H": "HIS", "I": "ILE", "L": "LEU", "K": "LYS", "M": "MET", "F": "PHE", "P": "PRO", "S": "SER",
    "T": "THR", "W": "TRP", "Y": "TYR", "V": "VAL",
}  # fmt: skip
RNA_LETTERS = {"A": "A", "G": "G", "C": "C", "U": "U"}
DNA_LETTERS = {"A": "DA", "G": "DG", "C": "DC", "T": "DT"}
UNKNOWN_RESIDUE = {"protein": "UNK", "rna": "N", "dna": "DN"}
LETTERS = {"protein": PROTEIN_LETTERS, "rna": RNA_LETTERS, "dna": DNA_LETTERS}


def residue_name(entity_type: str, letter: str) -> str:
    """CCD residue name of a one-letter code in a polymer of `entity_type`."""
    return LETTERS[entity_type].get(letter.upper(), UNKNOWN_RESIDUE[entity_type])


def token_id(entity_type: str, letter: str) -> int:
    """Vocabulary class of a one-letter code ('-' is the gap class in MSAs)."""
    if letter == "-":
        return GAP_ID
    return TOKEN_ID[residue_name(entity_type, letter)]
