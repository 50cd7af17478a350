"""Reference chemistry of residues and ligands: heavy atoms, charges, bonds, conformers.

Two sources, chosen per run:
- the Chemical Component Dictionary shipped inside biotite's wheel (default; nothing to download);
- a Boltz `mols` directory (one RDKit pickle per CCD code, as OSS Boltz-2 uses). Loading a pickle
  runs code from the file, so this is only for a directory the user configured and trusts
  (`ComponentLibrary(mols_dir=...)`); foldmill never looks for one on its own.

With RDKit installed (foldmill[smiles]), CCD entries are turned into RDKit molecules first, so bond
types (aromaticity perception), chiral tags and the ligand geometry restraints come out exactly as
OSS computes them from its pickles. Without RDKit, polymers and CCD ligands still featurize:
bond types come from the CCD's own orders and aromatic flags, chiral tags are 'unspecified'
(the model does not read them) and ligand restraints (used only by inference potentials) are empty.
"""

from __future__ import annotations

import functools
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from foldmill.vocab import BOND_TYPE_ID, CHIRALITY_ID

_CCD_BOND_TYPE = {"SING": "SINGLE", "DOUB": "DOUBLE", "TRIP": "TRIPLE", "AROM": "AROMATIC"}


@dataclass(frozen=True, eq=False)
class Component:
    """One residue or ligand type. Atom arrays cover heavy atoms only, in the source's order."""

    name: str
    atom_names: tuple[str, ...]
    symbols: tuple[str, ...]  # element symbols as written in structures ("C", "CL", "FE")
    elements: np.ndarray  # (n,) atomic numbers
    charges: np.ndarray  # (n,) formal charges
    chirality: np.ndarray  # (n,) CHIRALITY_ID
    leaving: np.ndarray  # (n,) bool: leaves when the residue links into a polymer (OXT, OP3, ...)
    conformers: np.ndarray  # (n_conformers, n, 3) float64 reference coordinates
    bonds: np.ndarray  # (n_bonds, 3) int64: first atom, second atom (first < second), BOND_TYPE_ID
    mol: Any = None  # RDKit Mol with hydrogens, for geometry restraints (None without RDKit)
    mol_index: np.ndarray | None = None  # (n,) index of each heavy atom in `mol`

    @property
    def n_atoms(self) -> int:
        return len(self.atom_names)

    @functools.cached_property
    def index_of(self) -> dict[str, int]:
        """Atom name -> heavy-atom index."""
        return {name: index for index, name in enumerate(self.atom_names)}


@dataclass(frozen=True)
class CcdEntry:
    """The raw CCD record of one component (all atoms, hydrogens included)."""

    code: str
    atom_names: tuple[str, ...]
    symbols: tuple[str, ...]
    charges: np.ndarray
    leaving: np.ndarray
    coords: np.ndarray | None  # (n, 3) ideal coordinates, else model coordinates, else None
    bonds: tuple[tuple[int, int, str, bool], ...]  # atom, atom, value_order, aromatic flag


def rdkit_available() -> bool:
    try:
        import rdkit  # noqa: F401
    except ImportError:
        return False
    return True


@functools.lru_cache(maxsize=None)
def ccd_entry(code: str) -> CcdEntry | None:
    """The CCD record of `code` from biotite's wheel, or None if the code is unknown."""
    from biotite.structure.info.ccd import get_from_ccd

    atoms = get_from_ccd("chem_comp_atom", code)
    if atoms is None:
        return None
    names = tuple(atoms["atom_id"].as_array(str))
    index = {name: i for i, name in enumerate(names)}
    bonds = []
    bond_rows = get_from_ccd("chem_comp_bond", code)
    if bond_rows is not None:
        for first, second, order, aromatic in zip(
            bond_rows["atom_id_1"].as_array(str),
            bond_rows["atom_id_2"].as_array(str),
            bond_rows["value_order"].as_array(str),
            bond_rows["pdbx_aromatic_flag"].as_array(str),
        ):
            bonds.append((index[first], index[second], order.upper(), aromatic.upper() == "Y"))
    return CcdEntry(
        code=code,
        atom_names=names,
        symbols=tuple(atoms["type_symbol"].as_array(str)),
        charges=atoms["charge"].as_array(np.int64, masked_value=0),
        leaving=atoms["pdbx_leaving_atom_flag"].as_array(str) == "Y",
        coords=_reference_coords(atoms),
        bonds=tuple(bonds),
    )


@functools.lru_cache(maxsize=None)
def component_type(code: str) -> str | None:
    """The CCD's chemical type of a component ("L-PEPTIDE LINKING", "NON-POLYMER", ...), upper case."""
    from biotite.structure.info.ccd import get_from_ccd

    column = get_from_ccd("chem_comp", code, "type")
    return None if column is None else str(column.as_array(str)[0]).upper()


def _reference_coords(atoms) -> np.ndarray | None:
    """Ideal coordinates if complete, else the model (experimental) ones if complete, else None."""
    for pattern in ("pdbx_model_Cartn_{}_ideal", "model_Cartn_{}"):
        columns = [atoms[pattern.format(axis)].as_array(np.float64, masked_value=np.nan) for axis in "xyz"]
        coords = np.stack(columns, axis=-1)
        if not np.isnan(coords).any():
            return coords
    return None


def atomic_number(symbol: str) -> int:
    """Atomic number of an element symbol as the CCD writes it ("C", "CL", "D" = hydrogen)."""
    import gemmi

    number = gemmi.Element(symbol).atomic_number
    if number == 0:
        raise ValueError(f"unknown element {str(symbol)!r}")
    return number


def component_from_entry(entry: CcdEntry) -> Component:
    """A Component straight from the CCD record, without RDKit (see the module docstring)."""
    if entry.coords is None:
        raise ValueError(f"CCD component {entry.code} has no complete coordinates (RDKit can compute them)")
    elements = np.array([atomic_number(symbol) for symbol in entry.symbols], dtype=np.int64)
    heavy = np.flatnonzero(elements != 1)
    if len(heavy) == 0:
        raise ValueError(f"CCD component {entry.code} has no heavy atoms")
    new_index = {int(old): new for new, old in enumerate(heavy)}
    bonds = [
        (min(new_index[a], new_index[b]), max(new_index[a], new_index[b]), _plain_bond_type(order, aromatic))
        for a, b, order, aromatic in entry.bonds
        if a in new_index and b in new_index
    ]
    return Component(
        name=entry.code,
        atom_names=tuple(entry.atom_names[i] for i in heavy),
        symbols=tuple(entry.symbols[i] for i in heavy),
        elements=elements[heavy],
        charges=entry.charges[heavy],
        chirality=np.full(len(heavy), CHIRALITY_ID["CHI_UNSPECIFIED"], dtype=np.int64),
        leaving=entry.leaving[heavy],
        conformers=entry.coords[heavy][None],
        bonds=np.array(bonds, dtype=np.int64).reshape(-1, 3),
    )


def _plain_bond_type(order: str, aromatic: bool) -> int:
    if aromatic:
        return BOND_TYPE_ID["AROMATIC"]
    return BOND_TYPE_ID[_CCD_BOND_TYPE.get(order, "OTHER")]


@functools.lru_cache(maxsize=None)
def ccd_component(code: str) -> Component | None:
    """The Component of a CCD code from biotite's CCD (through RDKit when installed); None if unknown."""
    entry = ccd_entry(code)
    if entry is None:
        return None
    if rdkit_available():
        from foldmill.features import rdkit_chem

        return rdkit_chem.component_from_mol(rdkit_chem.mol_from_ccd_entry(entry), code)
    return component_from_entry(entry)


class ComponentLibrary:
    """Looks up Components by CCD code from biotite's CCD or from a trusted Boltz `mols` directory."""

    def __init__(self, mols_dir: str | Path | None = None) -> None:
        self.mols_dir = Path(mols_dir) if mols_dir is not None else None
        self._loaded: dict[str, Component | None] = {}

    @property
    def source(self) -> str:
        return f"Boltz mols directory {self.mols_dir}" if self.mols_dir else "the CCD shipped with biotite"

    def get(self, code: str) -> Component | None:
        """The Component of `code`, or None if the source does not know it."""
        if self.mols_dir is None:
            return ccd_component(code)
        if code not in self._loaded:
            self._loaded[code] = self._load_pickle(code)
        return self._loaded[code]

    def _load_pickle(self, code: str) -> Component | None:
        path = self.mols_dir / f"{code}.pkl"
        if not path.is_file():
            return None
        from foldmill.features import rdkit_chem  # the pickles are RDKit molecules

        with open(path, "rb") as handle:
            mol = pickle.load(handle)  # noqa: S301 - trusted directory configured by the user
        return rdkit_chem.component_from_mol(mol, code)
