"""The featurizer on its own: the feature contract, atom bookkeeping, staged inputs, bad input,
batching, MSA pairing and deletions, and the RDKit-free chemistry path.

Equality with OSS Boltz-2 is in test_features_oracle.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from foldmill.errors import FoldmillError, InputError
from foldmill.features import FeaturizedTarget, StagedInputs, ccd, featurize, stack_featurized
from foldmill.features.msa_features import ChainMSA, pair_rows
from foldmill.features.residues import STANDARD_ATOMS
from foldmill.io.targets import Entity, Modification, Target, Template
from foldmill.msa.types import MSA
from foldmill.templates.align import align_template
from foldmill.templates.structure import read_template
from foldmill.vocab import TOKEN_ID

OSS_SPECS = Path(__file__).parent / "data" / "oss_feature_specs"  # names, shapes, dtypes of OSS model inputs
TRP_CAGE = "NLYIQWLKDGGPSSGRPPPS"
TYROSINE = "N[C@@H](Cc1ccc(O)cc1)C(=O)O"


def make_target(*entities: Entity, constraints=(), templates=(), target_id="t") -> Target:
    return Target(
        target_id, tuple(entities), tuple(templates), tuple(constraints), source="test.yaml", record="file"
    )


def write_tsv(destination: Path, **columns) -> None:
    pd.DataFrame(columns).to_csv(destination, sep="\t", index=False)


def protein(sequence=TRP_CAGE, chains=("A",), **kwargs) -> Entity:
    return Entity("protein", tuple(chains), sequence=sequence, **kwargs)


@pytest.fixture(scope="module")
def complex_target(data_dir) -> FeaturizedTarget:
    """Protein (modified residue, template) + DNA + CCD ligand + SMILES ligand."""
    target = make_target(
        protein(modifications=(Modification(3, "SEP"),)),
        Entity("dna", ("B",), sequence="GCGAATTC"),
        Entity("ligand", ("C",), ccd="SAH"),
        Entity("ligand", ("D",), smiles=TYROSINE),
        templates=(Template(str(data_dir / "structures" / "1l2y.cif"), chain_ids=("A",)),),
    )
    return featurize(target, StagedInputs.from_target(target))


def spec(name: str) -> dict:
    path = OSS_SPECS / f"boltz2_feature_spec_{name}.json"
    return {k: v for k, v in json.loads(path.read_text()).items() if k != "record"}


def test_features_follow_the_oss_contract(complex_target):
    """Names, dtypes and ranks as OSS's model input; token and padded atom axes consistent."""
    features, n_tokens, n_atoms = complex_target.features, complex_target.n_tokens, complex_target.n_atoms
    expected = spec("ligand")
    assert set(features) == set(expected)
    padded = features["ref_pos"].shape[1]
    assert padded % 32 == 0 and padded - 32 < n_atoms <= padded
    for name, (shape, dtype) in expected.items():
        tensor = features[name]
        assert str(tensor.dtype).removeprefix("torch.") == dtype, name
        assert tensor.dim() == len(shape) and tensor.shape[0] == 1, name
    assert features["token_pad_mask"].shape == (1, n_tokens)
    assert features["atom_to_token"].shape == (1, padded, n_tokens)
    assert features["atom_pad_mask"].sum() == n_atoms
    assert features["template_restype"].shape == (1, 1, n_tokens, 33)
    without_templates = set(spec("protein22"))
    single = featurize(make_target(protein()), StagedInputs())
    assert set(single.features) == without_templates


def test_atom_site_matches_the_atom_axis(complex_target):
    atoms, features = complex_target.atoms, complex_target.features
    n = complex_target.n_atoms
    assert len(atoms.atom_names) == n == len(atoms.token_index)
    atom_to_token = features["atom_to_token"][0, :n].argmax(-1).numpy()
    assert np.array_equal(atom_to_token, atoms.token_index)
    first = atoms.residue_numbers == 1
    assert list(atoms.atom_names[first & (atoms.chain_ids == "A")]) == list(STANDARD_ATOMS["ASN"])
    # Residue 3 is phosphoserine without its leaving OXT; the DNA keeps the fixed layout.
    sep = (atoms.chain_ids == "A") & (atoms.residue_numbers == 3)
    assert set(atoms.residue_names[sep]) == {"SEP"}
    assert "P" in atoms.atom_names[sep] and "OXT" not in atoms.atom_names[sep]
    assert list(atoms.atom_names[(atoms.chain_ids == "B") & first]) == list(STANDARD_ATOMS["DG"])
    # Ligands: one token per heavy atom; SMILES ligands are named LIG1..
    sah = atoms.chain_ids == "C"
    assert len(set(atoms.token_index[sah])) == sah.sum() and "H" not in set(atoms.elements[sah])
    assert set(atoms.residue_names[atoms.chain_ids == "D"]) == {"LIG1"}
    assert list(complex_target.token_chain_ids[:20]) == ["A"] * 20
    assert complex_target.sequences == {"A": TRP_CAGE, "B": "GCGAATTC", "C": "SAH", "D": TYROSINE}
    element_index = features["ref_element"][0, :n].argmax(-1).numpy()
    assert np.array_equal(element_index[atoms.elements == "C"], np.full((atoms.elements == "C").sum(), 6))
    # The modified residue is one token of class UNK, flagged as modified.
    token = atoms.token_index[sep][0]
    assert features["modified"][0, token] == 1 and features["res_type"][0, token].argmax() == TOKEN_ID["UNK"]


def test_seed_moves_only_reference_conformers():
    target = make_target(protein(), Entity("ligand", ("B",), ccd="SAH"))
    first, second = featurize(target, StagedInputs(), seed=1), featurize(target, StagedInputs(), seed=2)
    for name, value in first.features.items():
        assert torch.equal(value, second.features[name]) == (name != "ref_pos"), name
    again = featurize(target, StagedInputs(), seed=1)
    assert torch.equal(again.features["ref_pos"], first.features["ref_pos"])


@pytest.mark.parametrize(
    ("entities", "constraints", "problem"),
    [
        ((Entity("ligand", ("B",), ccd="ZZZZZ"),), (), "unknown CCD code 'ZZZZZ'"),
        ((protein(modifications=(Modification(2, "QQQQQ"),)),), (), "unknown CCD code 'QQQQQ'"),
        ((protein(modifications=(Modification(2, "HOH"),)),), (), "modification HOH is a non-polymer component"),
        ((Entity("ligand", ("B",), smiles="C1CC(N"),), (), "RDKit cannot parse the SMILES"),
        ((), ({"pocket": {"binder": "Z", "contacts": [["A", 1]]}},), "unknown chain 'Z'"),
        ((), ({"bond": {"atom1": ["A", 1, "CA"], "atom2": ["A", 2, "XX"]}},), "has no atom 'XX'"),
        ((), ({"contact": {"token1": ["A", 99], "token2": ["A", 1]}},), "residue 99 is outside chain A"),
    ],
)
def test_bad_input_is_one_clear_error(entities, constraints, problem):
    target = make_target(protein(), *entities, constraints=constraints)
    with pytest.raises(InputError, match=problem) as caught:
        featurize(target, StagedInputs())
    assert caught.value.source == "test.yaml" and caught.value.record


def test_unknown_method_is_refused():
    with pytest.raises(InputError, match="unknown method"):
        featurize(make_target(protein()), StagedInputs(), method="cryo")


def test_staged_manifests(tmp_path, data_dir):
    """MSAs and templates come from staging's manifests; rejected or mismatched MSAs are errors."""
    structure = read_template(data_dir / "structures" / "1l2y.cif")
    alignment = align_template(TRP_CAGE, structure, structure.chains["A"])
    alignment.save(tmp_path / "tmpl.npz")
    entity = protein(chains=("A", "B"))
    target = make_target(entity, target_id="dimer")
    residues = np.frombuffer(TRP_CAGE.encode(), dtype=np.uint8)
    rows = np.stack([residues, residues, np.where(np.arange(20) % 3 == 0, ord("-"), residues).astype(np.uint8)])
    deletions = np.zeros((3, 20), dtype=np.int32)
    deletions[1, 1] = 2
    MSA(rows, deletions, np.array(["", "k1", "k2"])).save(tmp_path / "a.npz")
    write_tsv(
        tmp_path / "msa_manifest.tsv", chain_hash=[entity.sequence_hash()], given_msa=[""], entity_type=["protein"],
        path=[str(tmp_path / "a.npz")], depth=[3], source=["search"],
    )  # fmt: skip
    write_tsv(
        tmp_path / "templates_manifest.tsv",
        target_id=["dimer", "other"],
        chain_id=["B", "A"],
        path=[str(tmp_path / "tmpl.npz")] * 2,
        force=[True, False],
        threshold=[2.5, ""],
    )
    staged = StagedInputs.from_manifests(tmp_path, target)
    features = featurize(target, staged).features
    # Query + two homolog rows; both chains share keys, so rows 1 and 2 are paired copies.
    assert features["msa"].shape == (1, 3, 40)
    assert features["msa_paired"][0, :, :].min() == 1
    assert features["has_deletion"][0, 1].sum() == 2  # one deletion per chain copy
    assert features["template_mask"][0, 0, :20].sum() == 0 and features["template_mask"][0, 0, 20:].sum() == 20
    assert features["visibility_ids"][0, 0, 0] == -1 and features["visibility_ids"][0, 0, 20] == 0
    assert features["template_force"].tolist() == [[True]] and features["template_force_threshold"].tolist() == [[2.5]]

    write_tsv(
        tmp_path / "msa_rejects.tsv", chain_hash=[entity.sequence_hash()], given_msa=[""], target_ids=["dimer"],
        source=["a.a3m"], problem=["bad row"],
    )  # fmt: skip
    with pytest.raises(InputError, match="MSA rejected by staging: bad row"):
        featurize(target, StagedInputs.from_manifests(tmp_path, target))
    # A manifest without the given-MSA column (older staging) is a one-line error, not a silent fallback.
    (tmp_path / "old").mkdir()
    write_tsv(tmp_path / "old" / "msa_manifest.tsv", chain_hash=[entity.sequence_hash()], path=["a.npz"])
    with pytest.raises(FoldmillError, match="not a foldmill MSA manifest \\(no column 'given_msa'\\)"):
        StagedInputs.from_manifests(tmp_path / "old", target)
    short = make_target(protein(TRP_CAGE[:10]))
    mismatch = StagedInputs(msa_paths={(short.entities[0].sequence_hash(), ""): tmp_path / "a.npz"})
    with pytest.raises(InputError, match="staged MSA has 20 columns"):
        featurize(short, mismatch)


def test_direct_inputs_read_msa_files_and_templates(tmp_path, data_dir):
    """Without staging: the A3M named by the target is parsed, user templates aligned on the spot."""
    a3m = tmp_path / "a.a3m"
    a3m.write_text(f">query\n{TRP_CAGE}\n>h1\n{TRP_CAGE[:5]}abc{TRP_CAGE[5:]}\n>h2\n--{TRP_CAGE[2:]}\n")
    template = Template(str(data_dir / "structures" / "1l2y.cif"), chain_ids=("A",))
    target = make_target(protein(msa=str(a3m)), templates=(template,))
    features = featurize(target, StagedInputs.from_target(target)).features
    assert features["msa"].shape == (1, 3, 20)
    expected = np.pi / 2 * np.arctan(3 / 3)
    assert features["deletion_value"][0, 1, 5].item() == pytest.approx(expected) and features["has_deletion"].sum() == 1
    assert features["template_mask"].sum() == 20
    truncated = featurize(target, StagedInputs.from_target(target), max_msa_seqs=2).features
    assert truncated["msa"].shape == (1, 2, 20)


def test_pairing_follows_oss_rules():
    """Keys shared by more chains first; chains missing a key fill in unpaired rows; no row reused."""

    def chain(keys):
        n = len(keys)
        return ChainMSA(np.zeros((n, 4), np.int64), np.zeros((n, 4), np.int64), np.array(keys))

    rows, paired = pair_rows([chain(["", "x", "y", "", "y"]), chain(["", "y", "z", "x"]), chain(["", "", "x"])])
    assert rows.tolist() == [
        [0, 0, 0],
        [1, 3, 2],  # x: in all three chains
        [2, 1, 1],  # y: chains 0 (twice) and 1; chain 2 takes its next unpaired row
        [4, 1, -1],  # y again (chain 1 cycles), chain 2 exhausted
        [3, 2, -1],  # unpaired rest
    ]
    assert paired.tolist() == [[1, 1, 1], [1, 1, 1], [1, 1, 0], [1, 1, 0], [0, 0, 0]]


def test_stack_pads_targets_into_one_batch():
    small = featurize(make_target(protein(TRP_CAGE[:8])), StagedInputs())
    large = featurize(make_target(protein(), Entity("ligand", ("B",), ccd="SAH")), StagedInputs())
    batch = stack_featurized([small, large])
    for name, value in batch.items():
        assert value.shape[0] == 2 and value.shape[1:] == large.features[name].shape[1:], name
    assert torch.equal(batch["ref_pos"][1], large.features["ref_pos"][0])
    assert torch.equal(batch["ref_pos"][0, : small.features["ref_pos"].shape[1]], small.features["ref_pos"][0])
    assert batch["token_pad_mask"][0].sum() == 8 and batch["atom_resolved_mask"].dtype == torch.bool


def test_without_rdkit_polymers_featurize_the_same(monkeypatch):
    """The plain-CCD path (no RDKit) differs only in the unread chirality tags."""
    target = make_target(protein(), Entity("rna", ("B",), sequence="GGACU"))
    with_rdkit = featurize(target, StagedInputs()).features
    monkeypatch.setattr(ccd, "rdkit_available", lambda: False)
    ccd.ccd_component.cache_clear()
    try:
        plain = featurize(target, StagedInputs()).features
    finally:
        ccd.ccd_component.cache_clear()
    for name, value in with_rdkit.items():
        if name != "ref_chirality":
            assert torch.equal(plain[name], value), name
    assert plain["ref_chirality"].max() == 0 and with_rdkit["ref_chirality"].max() > 0
