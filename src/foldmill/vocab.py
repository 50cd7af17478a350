"""Names every layer shares: the Boltz-2 residue-type vocabulary (33 classes), one-letter code maps,
and the per-sample confidence scalars the model returns and the writers write.

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

# Molecule types of chains/tokens (the model's `mol_type` feature).
MOL_TYPES = ("protein", "dna", "rna", "ligand")
MOL_TYPE_ID = {name: index for index, name in enumerate(MOL_TYPES)}

# Unknown residue class per polymer type; ligand atoms and modified protein residues use UNK.
UNKNOWN_TOKEN_ID = {kind: TOKEN_ID[name] for kind, name in UNKNOWN_RESIDUE.items()} | {"ligand": TOKEN_ID["UNK"]}

# Bond types (RDKit names); token bond features store type + 1 so that 0 means "no bond".
BOND_TYPES = ("OTHER", "SINGLE", "DOUBLE", "TRIPLE", "AROMATIC", "COVALENT")
BOND_TYPE_ID = {name: index for index, name in enumerate(BOND_TYPES)}

# RDKit chiral tags; anything else is CHI_OTHER.
CHIRALITY_TYPES = (
    "CHI_UNSPECIFIED", "CHI_TETRAHEDRAL_CW", "CHI_TETRAHEDRAL_CCW", "CHI_SQUAREPLANAR",
    "CHI_OCTAHEDRAL", "CHI_TRIGONALBIPYRAMIDAL", "CHI_OTHER",
)  # fmt: skip
CHIRALITY_ID = {name: index for index, name in enumerate(CHIRALITY_TYPES)}

# Pairwise contact conditioning classes (pocket and contact constraints).
CONTACT_CONDITIONING = {"UNSPECIFIED": 0, "UNSELECTED": 1, "POCKET>BINDER": 2, "BINDER>POCKET": 3, "CONTACT": 4}

# Experimental-method conditioning; Boltz-2 predicts as "x-ray diffraction" unless told otherwise.
METHOD_TYPE_ID = {
    "md": 0, "x-ray diffraction": 1, "electron microscopy": 2, "solution nmr": 3,
    "solid-state nmr": 4, "neutron diffraction": 4, "electron crystallography": 4,
    "fiber diffraction": 4, "powder diffraction": 4, "infrared spectroscopy": 4,
    "fluorescence transfer": 4, "epr": 4, "theoretical model": 4, "solution scattering": 4,
    "other": 4, "afdb": 5, "boltz-1": 6,
}  # fmt: skip
DEFAULT_METHOD = "x-ray diffraction"

NUM_ELEMENTS = 128  # one-hot width of ref_element (atomic number)
NUM_ATOM_NAME_CHARS = 64  # one-hot width per atom-name character (ASCII code - 32)


# Per-sample scalar confidences, named and ordered as Boltz writes them in its confidence JSON.
CONFIDENCE_SCALARS = (
    "confidence_score",
    "ptm",
    "iptm",
    "ligand_iptm",
    "protein_iptm",
    "complex_plddt",
    "complex_iplddt",
    "complex_pde",
    "complex_ipde",
)
