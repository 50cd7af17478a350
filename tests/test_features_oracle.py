"""foldmill's featurizer against OSS Boltz-2's (boltz-community 2.13) on the oracle cases.

Every tensor OSS feeds its model must be equal, bit for bit, for the same input and seed, with
three documented exceptions:
- deletion features: OSS zeroes them by a slicing bug; ours equal OSS with the bug corrected
  (and differ from OSS as shipped, shown by test_oss_loses_deletions_we_keep_them);
- template_frame_rot: the template engineer's frames are computed in float64, OSS's in float32
  (differences are rounding, <= 1e-6);
- query_to_template: ours holds the template residue numbers, OSS leaves zeros; the model
  does not read it.
Both sides use the same CCD chemistry (a Boltz `mols` directory built from biotite's CCD);
test_default_chemistry_matches_mols_directory shows foldmill's default (biotite, no mols) gives
the same features.
"""

from __future__ import annotations

import csv
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

pytest.importorskip("boltz")
pytest.importorskip("rdkit")

import oss_oracle  # noqa: E402
from oss_features_helper import oss_reference_features  # noqa: E402

from foldmill.features import StagedInputs, featurize  # noqa: E402
from foldmill.io.readers import read_inputs  # noqa: E402

pytestmark = pytest.mark.oracle

DELETIONS = ("deletion_value", "has_deletion", "deletion_mean")
ROUNDING = {"template_frame_rot": 1e-6}
NOT_READ_BY_MODEL = {"query_to_template"}
EXTRA_CODES = ["SAH", "SEP", "PSU"]
MULTIMER = (
    "MAHHHHHHVAVDAVSFTLLQDQLQSVLDTLSEREAGVVRLRFGLTDGQ",
    "MRYAFAAEATTCNAFWRNVDMTVTALYEVPLGVCTQDPDRWTTTPDD",
)


def _paired_csvs(directory: Path) -> list[str]:
    """Two chains' Boltz CSV MSAs: mutated copies with insertions; integer keys that repeat within
    a chain and are shared across chains, and unkeyed rows."""
    rng = np.random.default_rng(7)
    letters = "ACDEFGHIKLMNPQRSTVWY"
    names = []
    for chain, query in zip("AB", MULTIMER):
        rows = [("", query)]
        for _ in range(40):
            text = ""
            for residue in query:
                draw = rng.random()
                text += "-" if draw < 0.1 else letters[rng.integers(20)] if draw < 0.35 else residue
                if rng.random() < 0.05:
                    text += "".join(letters[rng.integers(20)] for _ in range(rng.integers(1, 4))).lower()
            rows.append((str(rng.integers(1, 25)) if rng.random() < 0.7 else "", text))
        name = f"{chain}.csv"
        with open(directory / name, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["key", "sequence"])
            writer.writerows(rows)
        names.append(name)
    return names


def _write_own_case(name: str, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    spec: dict = {"version": 1}
    if name == "dimer_keyed_msa":
        msa_a, msa_b = _paired_csvs(directory)
        spec["sequences"] = [
            {"protein": {"id": "A", "sequence": MULTIMER[0], "msa": msa_a}},
            {"protein": {"id": "B", "sequence": MULTIMER[1], "msa": msa_b}},
        ]
    elif name == "polymers_modified":
        sep = {"position": 5, "ccd": "SEP"}
        spec["sequences"] = [
            {"protein": {"id": "A", "sequence": MULTIMER[0][:30], "msa": "empty", "modifications": [sep]}},
            {"dna": {"id": "B", "sequence": "ATGCGTACGTTAGC"}},
            {"dna": {"id": "C", "sequence": "GCTAACGTACGCAT"}},
            {"rna": {"id": "D", "sequence": "GGACUUCGGUCC", "modifications": [{"position": 4, "ccd": "PSU"}]}},
        ]
    elif name == "ligands_constraints":
        pocket = [["A", 10], ["A", 20], ["D", 4]]
        spec["sequences"] = [
            {"protein": {"id": ["A", "D"], "sequence": "MKCLLVAGHWEKRTSDPQYFNMKCLAVGHWEKR", "msa": "empty"}},
            {"ligand": {"id": "B", "ccd": "SAH"}},
            {"ligand": {"id": "C", "smiles": "N[C@@H](Cc1ccc(O)cc1)C(=O)O"}},
        ]
        spec["constraints"] = [
            {"pocket": {"binder": "B", "contacts": pocket, "max_distance": 8.0, "force": True}},
            {"contact": {"token1": ["A", 5], "token2": ["C", "C1"], "max_distance": 10.0}},
            {"contact": {"token1": ["D", 7], "token2": ["C", "O1"], "max_distance": 7.0, "force": True}},
            {"bond": {"atom1": ["A", 3, "SG"], "atom2": ["B", 1, "N"]}},
        ]
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


CASES = {
    "monomer_msa": oss_oracle.write_case,
    "dimer_keyed_msa": None,
    "dimer_paired_msa": oss_oracle.write_case,  # Boltz's paired CSV: the query rows keyed 0 too
    "polymers_modified": None,
    "ligands_constraints": None,
    "template": oss_oracle.write_case,
    "cyclic_peptide": oss_oracle.write_case,
}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, data_dir):
    root = tmp_path_factory.mktemp("features_oracle")
    paths = {}
    for name, writer in CASES.items():
        paths[name] = writer(name, root / name, data_dir) if writer else _write_own_case(name, root / name)
    codes = {code for path in paths.values() for code in oss_oracle.mols_for_yaml(path)}
    mols = oss_oracle.build_mols_dir(sorted(codes | set(EXTRA_CODES)), root / "mols")
    return paths, mols


def ours(yaml_path: Path, mols: Path | None, seed: int = 0) -> dict[str, torch.Tensor]:
    target = next(read_inputs(yaml_path))
    return featurize(target, StagedInputs.from_target(target), seed=seed, mols_dir=mols).features


def assert_same(mine: dict[str, torch.Tensor], reference: dict[str, torch.Tensor], skip=()) -> None:
    assert set(mine) == set(reference), (set(mine) ^ set(reference))
    for name, expected in reference.items():
        if name in skip:
            continue
        actual = mine[name]
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, (name, actual.shape, expected.shape)
        if name in ROUNDING:
            assert torch.allclose(actual, expected, rtol=0, atol=ROUNDING[name]), name
        else:
            assert torch.equal(actual, expected), f"{name} differs from OSS"


@pytest.mark.parametrize("case", list(CASES))
def test_features_equal_oss(workspace, case):
    paths, mols = workspace
    reference = oss_reference_features(paths[case], mols, seed=3, corrected_deletions=True)
    mine = ours(paths[case], mols, seed=3)
    assert_same(mine, reference, skip=NOT_READ_BY_MODEL)
    if case == "template":
        assert reference["template_mask"].sum() > 0  # the template really aligned
    if case == "dimer_keyed_msa":
        assert 0 < reference["msa_paired"][0, 1:].mean() < 1  # some rows paired by key, some not


def test_oss_loses_deletions_we_keep_them(workspace):
    paths, mols = workspace
    shipped = oss_reference_features(paths["dimer_keyed_msa"], mols, seed=0)
    mine = ours(paths["dimer_keyed_msa"], mols)
    assert not shipped["has_deletion"].any() and not shipped["deletion_value"].any()
    assert mine["has_deletion"].sum() > 10 and mine["deletion_mean"].max() > 0
    assert_same({k: v for k, v in mine.items()}, shipped, skip=(*DELETIONS, *NOT_READ_BY_MODEL))


def test_default_chemistry_matches_mols_directory(workspace):
    """biotite's CCD (foldmill's default, through RDKit) gives what the pickled molecules give."""
    paths, mols = workspace
    for case in ("ligands_constraints", "polymers_modified"):
        assert_same(ours(paths[case], None), ours(paths[case], mols))


def test_conformer_choice_matches_oss(workspace, tmp_path):
    """With several conformers per molecule (as in Boltz's own mols), both draw the same ones."""
    from rdkit import Chem

    paths, mols = workspace
    multi = tmp_path / "mols"
    shutil.copytree(mols, multi)
    Chem.SetDefaultPickleProperties(Chem.PropertyPickleOptions.AllProps)
    for path in multi.glob("*.pkl"):
        mol = pickle.loads(path.read_bytes())
        for shift in (1.0, 2.0):
            conformer = Chem.Conformer(mol.GetConformer())
            for i in range(mol.GetNumAtoms()):
                position = conformer.GetAtomPosition(i)
                conformer.SetAtomPosition(i, (position.x * (1 + shift), position.y - shift, position.z))
            mol.AddConformer(conformer, assignId=True)
        path.write_bytes(pickle.dumps(mol))
    reference = oss_reference_features(paths["cyclic_peptide"], multi, seed=5)
    mine = ours(paths["cyclic_peptide"], multi, seed=5)
    assert_same(mine, reference)
    assert not torch.equal(mine["ref_pos"], ours(paths["cyclic_peptide"], mols, seed=5)["ref_pos"])
