"""Template alignments and Boltz-2 template features on real structures (1aki, 3o5r, 5ugo, 1igy),
coordinates checked against an independent gemmi read, frames against OSS Boltz's frame code."""

from __future__ import annotations

import shutil
from pathlib import Path

import gemmi
import numpy as np
import pandas as pd
import pytest

from foldmill.features.template_residues import residue_class, template_features
from foldmill.io.worklist import build_worklist, write_worklist
from foldmill.msa.mmseqs import SearchSettings, search, target_database
from foldmill.templates.align import align_template
from foldmill.templates.search import (
    TemplateSearchConfig,
    TemplateSelector,
    structure_files,
    write_seqres,
)
from foldmill.templates.staging import TemplateStagingConfig, stage_templates
from foldmill.templates.structure import read_template
from foldmill.templates.types import BACKBONE_ATOMS, TemplateAlignment
from foldmill.vocab import TOKEN_ID


def gemmi_backbone(path: Path, chain_id: str) -> dict[int, tuple[str, dict[str, np.ndarray]]]:
    """label_seq -> (residue name, {atom name: position}) of a chain, read straight from gemmi."""
    structure = gemmi.read_structure(str(path))
    structure.remove_alternative_conformations()
    residues = {}
    for chain in structure[0]:
        if chain.name != chain_id:
            continue
        for residue in chain.get_polymer():
            atoms = {a.name: np.array([a.pos.x, a.pos.y, a.pos.z]) for a in residue if a.name in BACKBONE_ATOMS}
            residues.setdefault(residue.label_seq, (residue.name, atoms))
    return residues


def mutate(sequence: str) -> str:
    """Prefix 5 residues, substitute residue 31, delete residue 61: a realistic non-trivial query."""
    return "MSGSH" + sequence[:30] + ("W" if sequence[30] != "W" else "F") + sequence[31:60] + sequence[61:]


@pytest.mark.parametrize(("name", "chain_id"), [("1aki", "A"), ("3o5r", "A"), ("5ugo", "A")])
def test_alignment_coordinates_round_trip_against_gemmi(
    tmp_path: Path, data_dir: Path, name: str, chain_id: str
) -> None:
    path = data_dir / "structures" / f"{name}.cif"
    structure = read_template(path)
    chain = structure.chains[chain_id]
    query = mutate(chain.sequence)
    alignment = align_template(query, structure, chain)
    alignment.save(tmp_path / "t.npz")
    loaded = TemplateAlignment.load(tmp_path / "t.npz")
    assert loaded.template_id == f"{name}_{chain_id}" and loaded.template_chain_id == chain_id
    assert loaded.source == str(path)

    # Nearly the whole chain aligns, in order, with the query offset by the 5-residue prefix.
    assert len(loaded) >= len(chain.sequence) - 2
    assert np.all(np.diff(loaded.query_index) > 0) and np.all(np.diff(loaded.template_index) > 0)
    assert loaded.query_index[0] == 5 and loaded.template_index[0] == 0

    reference = gemmi_backbone(path, chain_id)
    resolved = 0
    for t, residue_name, coords, mask in zip(
        loaded.template_index, loaded.template_residue_names, loaded.coords, loaded.atom_mask, strict=True
    ):
        if t + 1 not in reference:  # unresolved residue: nothing may be claimed present
            assert not mask.any()
            continue
        ref_name, atoms = reference[t + 1]
        assert residue_name == ref_name
        for slot, atom_name in enumerate(BACKBONE_ATOMS):
            assert mask[slot] == (atom_name in atoms)
            if atom_name in atoms:
                np.testing.assert_allclose(coords[slot], atoms[atom_name], atol=1e-3)
        resolved += 1
    assert resolved >= 0.95 * len(loaded)


def test_unresolved_template_residues_are_aligned_but_masked(data_dir: Path) -> None:
    structure = read_template(data_dir / "structures" / "5ugo.cif")
    chain = structure.chains["A"]
    missing = np.flatnonzero(~chain.atom_mask[:, 1])
    assert len(missing) > 0  # 5ugo chain A has residues without coordinates
    alignment = align_template(chain.sequence, structure, chain)
    features = template_features([alignment], len(chain.sequence))
    assert features["template_mask"][0, missing].all()
    assert not features["template_mask_frame"][0, missing].any()
    assert not features["template_mask_cb"][0, missing].any()


def test_template_features_match_boltz_frames(data_dir: Path) -> None:
    from boltz.data.tokenize.boltz2 import compute_frame

    structure = read_template(data_dir / "structures" / "1aki.cif")
    chain = structure.chains["A"]
    query = mutate(chain.sequence)
    alignment = align_template(query, structure, chain)
    features = template_features([alignment, alignment], len(query))
    assert features["template_frame_rot"].shape == (2, len(query), 3, 3)
    q = alignment.query_index
    coords, mask = alignment.coords, alignment.atom_mask

    unaligned = np.setdiff1d(np.arange(len(query)), q)
    assert len(unaligned) >= 5 and not features["template_mask"][0, unaligned].any()
    assert (features["template_restype_ids"][0, unaligned] == 0).all()

    for i, position in enumerate(q):
        rotation, translation = compute_frame(coords[i, 0], coords[i, 1], coords[i, 2])
        np.testing.assert_allclose(features["template_frame_rot"][0, position], rotation, atol=1e-5)
        np.testing.assert_allclose(features["template_frame_t"][0, position], translation, atol=1e-5)
    rotations = features["template_frame_rot"][0, q].astype(np.float64)
    np.testing.assert_allclose(
        rotations @ rotations.transpose(0, 2, 1), np.broadcast_to(np.eye(3), rotations.shape), atol=1e-5
    )
    np.testing.assert_allclose(np.linalg.det(rotations), 1.0, atol=1e-5)

    names = alignment.template_residue_names
    glycine = names == "GLY"
    assert glycine.any()
    np.testing.assert_allclose(features["template_cb"][0, q[glycine]], coords[glycine, 1])
    np.testing.assert_allclose(features["template_cb"][0, q[~glycine]], coords[~glycine, 3])
    np.testing.assert_allclose(features["template_ca"][0, q], coords[:, 1])
    assert (features["template_restype_ids"][0, q] == [TOKEN_ID[n] for n in names]).all()
    assert features["template_mask_frame"][0, q].all()  # 1aki is fully resolved
    np.testing.assert_array_equal(features["template_mask_cb"][0, q], np.where(glycine, mask[:, 1], mask[:, 3]))
    assert features["template_mask_cb"][0, q].all()
    np.testing.assert_array_equal(features["query_to_template"][0, q], alignment.template_index)


def test_modified_residues_take_their_parent_class() -> None:
    assert residue_class("MSE") == TOKEN_ID["MET"]
    assert residue_class("SEP") == TOKEN_ID["SER"]
    assert residue_class("ALA") == TOKEN_ID["ALA"]
    assert residue_class("XYZ") == TOKEN_ID["UNK"]


@pytest.mark.skipif(shutil.which("mmseqs") is None, reason="needs MMseqs2")
def test_template_search_top_k_and_release_date(tmp_path: Path, data_dir: Path) -> None:
    seqres = tmp_path / "seqres.fasta"
    assert write_seqres(structure_files(data_dir / "structures"), seqres) == 8
    lysozyme = read_template(data_dir / "structures" / "1aki.cif").chains["A"].sequence
    light = read_template(data_dir / "structures" / "1igy.cif").chains["A"].sequence
    dhfr = read_template(data_dir / "structures" / "3o5r.cif").chains["A"].sequence
    queries = {"lysozyme": mutate(lysozyme), "light": light, "dhfr": dhfr}
    settings = SearchSettings(evalue=1e-3, max_seqs=1000, diversity_filter=False, threads=2)
    # One MMseqs2 search; top-k and release-date limits are applied to its ranked hits.
    # (search_templates, search + selection in one call, runs in tests/test_msa_staging.py.)
    hits = search(queries, target_database(seqres, tmp_path / "cache"), tmp_path / "work", settings)

    def select(top_k: int, date: str = "") -> dict[str, list[str]]:
        selector = TemplateSelector(
            TemplateSearchConfig(str(seqres), str(data_dir / "structures"), date, top_k, settings)
        )
        return {name: [a.template_id for a in selector.select(queries[name], hits[name])] for name in queries}

    assert select(top_k=4) == {
        "lysozyme": ["1aki_A"],
        "light": ["1igy_A", "1igy_C", "1igy_B", "1igy_D"],
        "dhfr": ["3o5r_A"],
    }
    assert select(top_k=1)["light"] == ["1igy_A"]
    # 1aki was released 1997-11-19, 1igy 1998-04-15, 3o5r 2011-06-01
    assert select(top_k=4, date="1998-01-01") == {"lysozyme": ["1aki_A"], "light": [], "dhfr": []}
    assert select(top_k=2, date="1998-04-15")["light"] == ["1igy_A", "1igy_C"]


def test_user_templates_staged_and_bad_ones_rejected(tmp_path: Path, data_dir: Path) -> None:
    lysozyme = read_template(data_dir / "structures" / "1aki.cif").chains["A"].sequence
    structure = data_dir / "structures" / "1aki.cif"
    (tmp_path / "good.yaml").write_text(
        "version: 1\nsequences:\n"
        f"  - protein: {{id: [A, B], sequence: {mutate(lysozyme)}}}\n"
        f"  - protein: {{id: C, sequence: MKTAYIAKQRQISFVKSHFSRQ}}\n"
        f"templates:\n  - cif: {structure}\n    chain_id: [A, B]\n    template_id: [A, A]\n"
        "    force: true\n    threshold: 2.0\n"
    )
    (tmp_path / "bad.yaml").write_text(
        "version: 1\nsequences:\n"
        f"  - protein: {{id: A, sequence: {lysozyme}}}\n"
        f"templates:\n  - cif: {structure}\n    chain_id: A\n    template_id: Z\n"
    )
    result = build_worklist([tmp_path / "good.yaml", tmp_path / "bad.yaml"])
    write_worklist(result, tmp_path / "worklist", write_rejects=False)
    staged = stage_templates(
        tmp_path / "worklist" / "worklist.tsv", tmp_path / "staged" / "templates_manifest.tsv",
        TemplateStagingConfig(), tmp_path / "staged" / "templates_rejects.tsv",
    )  # fmt: skip
    manifest = pd.read_csv(tmp_path / "staged" / "templates_manifest.tsv", sep="\t", dtype=str, keep_default_na=False)
    assert manifest[["target_id", "chain_id", "template_id", "source", "force", "threshold"]].values.tolist() == [
        ["good", "A", "1aki_A", "user", "True", "2.0"],
        ["good", "B", "1aki_A", "user", "True", "2.0"],
    ]
    assert len(TemplateAlignment.load(manifest["path"].iloc[0])) >= 127
    rejects = pd.read_csv(tmp_path / "staged" / "templates_rejects.tsv", sep="\t", dtype=str)
    assert rejects["target_id"].tolist() == ["bad"]
    assert "1aki.cif" in rejects["problem"].iloc[0] and "no protein chain Z" in rejects["problem"].iloc[0]
    assert staged.searched == 0


def test_empty_manifest_without_templates(tmp_path: Path, data_dir: Path) -> None:
    result = build_worklist([data_dir / "proteomes" / "yeast_chr1.fasta"])
    write_worklist(result, tmp_path / "worklist", write_rejects=False)
    stage_templates(
        tmp_path / "worklist" / "worklist.tsv", tmp_path / "templates_manifest.tsv", TemplateStagingConfig()
    )
    assert (
        tmp_path / "templates_manifest.tsv"
    ).read_text().strip() == "target_id\tchain_id\ttemplate_id\tpath\tsource\tforce\tthreshold"
