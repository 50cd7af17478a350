"""RDKit chemistry: CCD entries and SMILES to molecules, molecules to Components, and the
per-residue geometry restraints (distance bounds, chirality, double-bond stereo, planarity) that
Boltz-2's inference potentials use.

Requires RDKit (the `smiles` extra). Conventions follow OSS Boltz-2 so that features match:
molecules keep their hydrogens and carry the atom properties `name` and `leaving_atom`;
SMILES atoms are named element + running number in RDKit canonical-rank order.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from rdkit import Chem, rdBase
from rdkit.Chem import AllChem
from rdkit.Chem.rdchem import BondStereo, HybridizationType, Mol
from rdkit.Chem.rdDistGeom import GetMoleculeBoundsMatrix

from foldmill.features.ccd import CcdEntry, Component, atomic_number
from foldmill.vocab import BOND_TYPE_ID, CHIRALITY_ID

REFERENCE_SEED = 42  # conformer generation for SMILES and incomplete CCD entries: fixed, reproducible

_RDKIT_BOND = {
    "SING": Chem.BondType.SINGLE,
    "DOUB": Chem.BondType.DOUBLE,
    "TRIP": Chem.BondType.TRIPLE,
    "QUAD": Chem.BondType.QUADRUPLE,
    "AROM": Chem.BondType.AROMATIC,
}


def mol_from_ccd_entry(entry: CcdEntry) -> Mol:
    """An RDKit molecule (hydrogens included) of a CCD entry, with chirality assigned from 3D.

    Raises ValueError for entries RDKit cannot represent (unknown elements, no coordinates).
    """
    blocker = rdBase.BlockLogs()  # noqa: F841 - CCD oddities would flood the log with warnings
    mol = Chem.RWMol()
    for name, symbol, charge, leaving in zip(entry.atom_names, entry.symbols, entry.charges, entry.leaving):
        atom = Chem.Atom(atomic_number(symbol))
        atom.SetFormalCharge(int(charge))
        atom.SetNoImplicit(True)  # the CCD lists every hydrogen
        atom.SetProp("name", name)
        atom.SetProp("leaving_atom", "1" if leaving else "0")
        mol.AddAtom(atom)
    for first, second, order, _aromatic in entry.bonds:
        # Kekulé orders; sanitization perceives aromaticity the way RDKit (and so OSS) does.
        mol.AddBond(first, second, _RDKIT_BOND.get(order, Chem.BondType.OTHER))
    mol = mol.GetMol()
    _sanitize(mol)
    if entry.coords is not None:
        conformer = Chem.Conformer(mol.GetNumAtoms())
        for index, position in enumerate(entry.coords):
            conformer.SetAtomPosition(index, position.tolist())
        conformer.SetProp("name", "Ideal")
        mol.AddConformer(conformer, assignId=True)
    elif not _embed(mol):
        raise ValueError(f"CCD component {entry.code} has no coordinates and RDKit cannot embed it")
    Chem.AssignStereochemistryFrom3D(mol, confId=mol.GetConformer().GetId())
    return mol


def _sanitize(mol: Mol) -> None:
    """Full sanitization; CCD entries with unusual valences keep what can be perceived."""
    if Chem.SanitizeMol(mol, catchErrors=True) == Chem.SanitizeFlags.SANITIZE_NONE:
        return
    relaxed = Chem.SanitizeFlags.SANITIZE_ALL ^ Chem.SanitizeFlags.SANITIZE_PROPERTIES
    Chem.SanitizeMol(mol, sanitizeOps=relaxed, catchErrors=True)
    mol.UpdatePropertyCache(strict=False)


def _embed(mol: Mol) -> bool:
    """Add an ETKDGv3 conformer (UFF-relaxed), seeded; random starting coordinates as fallback."""
    options = AllChem.ETKDGv3()
    options.clearConfs = False
    options.randomSeed = REFERENCE_SEED
    conf_id = -1
    try:
        conf_id = AllChem.EmbedMolecule(mol, options)
        if conf_id == -1:
            options.useRandomCoords = True
            conf_id = AllChem.EmbedMolecule(mol, options)
        AllChem.UFFOptimizeMolecule(mol, confId=conf_id, maxIters=1000)
    except (RuntimeError, ValueError):
        pass  # force-field or sanitization trouble: keep the unrelaxed embedding if any
    if conf_id == -1:
        return False
    mol.GetConformer(conf_id).SetProp("name", "Computed")
    return True


def component_from_mol(mol: Mol, name: str, restraint_mol: Mol | None = None) -> Component:
    """A Component from an RDKit molecule (heavy atoms in molecule order, all its conformers).

    `restraint_mol` is the molecule the geometry restraints are computed on (default `mol`);
    its heavy atoms must be `mol`'s heavy atoms in the same order.
    """
    restraint_mol = restraint_mol if restraint_mol is not None else mol
    heavy = [atom for atom in mol.GetAtoms() if atom.GetAtomicNum() != 1]
    if not heavy:
        raise ValueError(f"molecule {name} has no heavy atoms")
    heavy_index = {atom.GetIdx(): i for i, atom in enumerate(heavy)}
    bonds = []
    for bond in mol.GetBonds():
        first, second = bond.GetBeginAtomIdx(), bond.GetEndAtomIdx()
        if first in heavy_index and second in heavy_index:
            a, b = heavy_index[first], heavy_index[second]
            kind = BOND_TYPE_ID.get(bond.GetBondType().name, BOND_TYPE_ID["OTHER"])
            bonds.append((min(a, b), max(a, b), kind))
    conformers = np.array(
        [[list(conformer.GetAtomPosition(atom.GetIdx())) for atom in heavy] for conformer in mol.GetConformers()],
        dtype=np.float64,
    ).reshape(-1, len(heavy), 3)
    if len(conformers) == 0:
        raise ValueError(f"molecule {name} has no conformer")
    return Component(
        name=name,
        atom_names=tuple(atom.GetProp("name") for atom in heavy),
        symbols=tuple(atom.GetSymbol().upper() for atom in heavy),
        elements=np.array([atom.GetAtomicNum() for atom in heavy], dtype=np.int64),
        charges=np.array([atom.GetFormalCharge() for atom in heavy], dtype=np.int64),
        chirality=np.array(
            [CHIRALITY_ID.get(atom.GetChiralTag().name, CHIRALITY_ID["CHI_OTHER"]) for atom in heavy], dtype=np.int64
        ),
        leaving=np.array(
            [atom.HasProp("leaving_atom") and bool(int(atom.GetProp("leaving_atom"))) for atom in heavy], dtype=bool
        ),
        conformers=conformers,
        bonds=np.array(bonds, dtype=np.int64).reshape(-1, 3),
        mol=restraint_mol,
        mol_index=np.array([a.GetIdx() for a in restraint_mol.GetAtoms() if a.GetAtomicNum() != 1], dtype=np.int64),
    )


@functools.lru_cache(maxsize=256)
def smiles_component(smiles: str, name: str) -> Component:
    """A ligand Component from SMILES: hydrogens added, atoms named, one ETKDGv3 conformer.

    Raises ValueError with the reason if RDKit cannot parse or embed the molecule.
    """
    blocker = rdBase.BlockLogs()  # noqa: F841 - the reason goes into the error, not the log
    mol = AllChem.MolFromSmiles(smiles)
    if mol is None:
        raise ValueError("RDKit cannot parse the SMILES")
    mol.UpdatePropertyCache(strict=True)
    mol = AllChem.AddHs(mol)
    ranks = list(AllChem.CanonicalRankAtoms(mol))
    Chem.AssignStereochemistry(mol, force=True, cleanIt=True)
    counts: dict[str, int] = {}
    for index in sorted(range(mol.GetNumAtoms()), key=lambda i: ranks[i]):
        atom = mol.GetAtomWithIdx(index)
        symbol = atom.GetSymbol().upper()
        counts[symbol] = counts.get(symbol, 0) + 1
        atom_name = f"{symbol}{counts[symbol]}"
        if len(atom_name) > 4:
            raise ValueError(f"too many {symbol} atoms to name them in 4 characters")
        atom.SetProp("name", atom_name)
    if not _embed(mol):
        raise ValueError("RDKit cannot compute a 3D conformer")
    # OSS reads reference chemistry (chiral tags included) from the hydrogen-free copy.
    return component_from_mol(AllChem.RemoveHs(mol, sanitize=False), name, restraint_mol=mol)


# --- geometry restraints ---------------------------------------------------------------------


@dataclass(frozen=True)
class Restraints:
    """Geometry restraints of one residue, atom indices local to its kept heavy atoms."""

    bounds_index: np.ndarray  # (n, 2)
    bounds_is_bond: np.ndarray  # (n,) bool
    bounds_is_angle: np.ndarray  # (n,) bool
    upper_bounds: np.ndarray  # (n,) float32
    lower_bounds: np.ndarray  # (n,) float32
    chiral_index: np.ndarray  # (n, 4)
    chiral_is_reference: np.ndarray
    chiral_is_r: np.ndarray
    stereo_index: np.ndarray  # (n, 4)
    stereo_is_reference: np.ndarray
    stereo_is_e: np.ndarray
    planar_bond_index: np.ndarray  # (n, 6)
    planar_ring5_index: np.ndarray  # (n, 5)
    planar_ring6_index: np.ndarray  # (n, 6)


_PLANAR_DOUBLE_BOND = Chem.MolFromSmarts("[C;X3;^2](*)(*)=[C;X3;^2](*)(*)")
_AROMATIC_RING5 = Chem.MolFromSmarts("[ar5^2]1[ar5^2][ar5^2][ar5^2][ar5^2]1")
_AROMATIC_RING6 = Chem.MolFromSmarts("[ar6^2]1[ar6^2][ar6^2][ar6^2][ar6^2][ar6^2]1")
_ANY_BOND = Chem.MolFromSmarts("*~*")
_ANY_ANGLE = Chem.MolFromSmarts("*~*~*")


@functools.lru_cache(maxsize=4096)
def residue_restraints(component: Component, kept: tuple[int, ...]) -> Restraints:
    """Restraints among the heavy atoms `kept` (indices into the component), renumbered 0..len(kept)-1.

    Computed on a copy of the component's molecule, in OSS's order (stereo perception in the
    chirality step changes the molecule that the later steps see).
    """
    mol = Chem.Mol(component.mol)
    local = {int(component.mol_index[k]): i for i, k in enumerate(kept)}
    bounds = _distance_bounds(mol, local)
    chiral = _chiral_centers(mol, local)
    stereo = _stereo_bonds(mol, local)
    patterns = ((_PLANAR_DOUBLE_BOND, 6), (_AROMATIC_RING5, 5), (_AROMATIC_RING6, 6))
    planar = [_matches(mol, pattern, local, size) for pattern, size in patterns]
    return Restraints(*bounds, *chiral, *stereo, *planar)


def _distance_bounds(mol: Mol, local: dict[int, int]):
    pairs = np.zeros((0, 2), dtype=np.int64)
    is_bond = is_angle = np.zeros(0, dtype=bool)
    upper = lower = np.zeros(0, dtype=np.float32)
    if mol.GetNumAtoms() > 1:
        mol.UpdatePropertyCache(strict=False)
        Chem.GetSymmSSSR(mol)
        matrix = GetMoleculeBoundsMatrix(
            mol, set15bounds=True, scaleVDW=True, doTriangleSmoothing=True, useMacrocycle14config=False
        )
        bonded = {tuple(sorted(match)) for match in mol.GetSubstructMatches(_ANY_BOND)}
        angled = {tuple(sorted((match[0], match[2]))) for match in mol.GetSubstructMatches(_ANY_ANGLE)}
        rows, cols = np.triu_indices(mol.GetNumAtoms(), k=1)
        keep = np.array([i in local and j in local for i, j in zip(rows.tolist(), cols.tolist())], dtype=bool)
        rows, cols = rows[keep], cols[keep]
        kept_pairs = list(zip(rows.tolist(), cols.tolist()))
        pairs = np.array([(local[i], local[j]) for i, j in kept_pairs], dtype=np.int64).reshape(-1, 2)
        is_bond = np.array([pair in bonded for pair in kept_pairs], dtype=bool)
        is_angle = np.array([pair in angled for pair in kept_pairs], dtype=bool)
        upper = matrix[rows, cols].astype(np.float32)
        lower = matrix[cols, rows].astype(np.float32)
    return pairs, is_bond, is_angle, upper, lower


def _cip_ranked(atom, exclude: int | None = None) -> list[int]:
    """Neighbour indices by decreasing CIP rank (ties keep bond order)."""
    ranked = [(n.GetIdx(), int(n.GetProp("_CIPRank"))) for n in atom.GetNeighbors() if n.GetIdx() != exclude]
    return [index for index, _ in sorted(ranked, key=lambda item: item[1], reverse=True)]


def _chiral_centers(mol: Mol, local: dict[int, int]):
    rows: list[tuple[tuple[int, ...], bool, bool]] = []
    Chem.AssignStereochemistry(mol, cleanIt=True, force=True)
    if all(atom.HasProp("_CIPRank") for atom in mol.GetAtoms()):
        for center_index, label in Chem.FindMolChiralCenters(mol, includeUnassigned=False):
            center = mol.GetAtomWithIdx(center_index)
            neighbors = tuple(_cip_ranked(center))
            if len(neighbors) > 4 or center.GetHybridization() != HybridizationType.SP3:
                continue
            is_r = label == "R"
            rows.append(((*neighbors[:3], center_index), True, is_r))
            if len(neighbors) == 4:
                # The three other triples of neighbours, ordered to keep the same handedness.
                for skipped in range(3):
                    triple = neighbors[:skipped] + neighbors[skipped + 1 :]
                    ordered = triple[::-1] if skipped % 2 == 0 else triple
                    rows.append(((*ordered, center_index), False, is_r))
    return _local_rows(rows, local, 4)


def _stereo_bonds(mol: Mol, local: dict[int, int]):
    rows: list[tuple[tuple[int, ...], bool, bool]] = []
    if all(atom.HasProp("_CIPRank") for atom in mol.GetAtoms()):
        for bond in mol.GetBonds():
            stereo = bond.GetStereo()
            if stereo not in (BondStereo.STEREOE, BondStereo.STEREOZ):
                continue
            start, end = bond.GetBeginAtomIdx(), bond.GetEndAtomIdx()
            start_neighbors = _cip_ranked(mol.GetAtomWithIdx(start), exclude=end)
            end_neighbors = _cip_ranked(mol.GetAtomWithIdx(end), exclude=start)
            is_e = stereo == BondStereo.STEREOE
            rows.append(((start_neighbors[0], start, end, end_neighbors[0]), True, is_e))
            if len(start_neighbors) == 2 and len(end_neighbors) == 2:
                rows.append(((start_neighbors[1], start, end, end_neighbors[1]), False, is_e))
    return _local_rows(rows, local, 4)


def _local_rows(rows, local: dict[int, int], width: int):
    kept = [(tuple(local[i] for i in atoms), a, b) for atoms, a, b in rows if all(i in local for i in atoms)]
    index = np.array([atoms for atoms, _, _ in kept], dtype=np.int64).reshape(-1, width)
    first = np.array([a for _, a, _ in kept], dtype=bool)
    second = np.array([b for _, _, b in kept], dtype=bool)
    return index, first, second


def _matches(mol: Mol, pattern: Mol, local: dict[int, int], width: int) -> np.ndarray:
    matches = mol.GetSubstructMatches(pattern)
    found = [tuple(local[i] for i in match) for match in matches if all(i in local for i in match)]
    return np.array(found, dtype=np.int64).reshape(-1, width)


def covalent_bond_length(element_1: int, element_2: int) -> tuple[float, bool]:
    """Sum of covalent radii of two elements, and whether a 2.0 Å fallback was used instead."""
    table = Chem.GetPeriodicTable()
    try:
        radius_1, radius_2 = table.GetRcovalent(int(element_1)), table.GetRcovalent(int(element_2))
    except (RuntimeError, ValueError, OverflowError):
        return 2.0, True
    if radius_1 <= 0 or radius_2 <= 0:
        return 2.0, True
    return float(radius_1 + radius_2), False
