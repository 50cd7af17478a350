"""Paired MSAs of complexes through staging to the featurizer, against OSS Boltz-2.

One staging run (ColabFold's protocol against the small ColabFold-format test database) of a
worklist holding the hemoglobin heterodimer, its alpha chain alone and a chain without homologs.
OSS Boltz's own MSA-server path (`boltz.main.compute_msa`, which turns a paired and an unpaired
A3M per chain into its key,sequence CSVs) is fed the very A3Ms that run searched, and its
featurizer must give the features ours gives from the staged MSAs.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from unittest import mock

import pandas as pd
import pytest
import torch
import yaml

from foldmill.features import StagedInputs, featurize
from foldmill.io.worklist import build_worklist, load_worklist, write_worklist
from foldmill.msa import staging
from foldmill.msa.staging import MSAStagingConfig, complex_key, read_msa_manifest, stage_msas
from foldmill.msa.types import MSA
from foldmill.outputs.summary import RunRecords, build_summary, summary_notes

REPO = Path(__file__).resolve().parents[1]
MSAS = REPO / "tests" / "data" / "msas"
HEMOGLOBIN_BETA = (
    "VHLTPEEKSAVTALWGKVNVDEVGGEALGRLLVVYPWTQRFFESFGDLSTPDAVMGNPKVKAHGKKVLGAFSDGLAHLDNLKGTFATLSELHCDKLHVDPENFRLL"
    "GNVLVCVLAHHFGKEFTPPVQAAYQKVVAGVANALAHKYH"
)
NO_HIT = "MSTTASTPSSLRHLISIKDLSDEEFRILVQRAQHFKNVFKANKTN"  # a yeast peptide without homologs in the database


def query_of(a3m: Path) -> str:
    lines = a3m.read_text().splitlines()
    return lines[next(i for i, line in enumerate(lines) if line.startswith(">")) + 1].strip()


ALPHA = query_of(MSAS / "1a00_A_uniref90.a3m")


def write_run(root: Path) -> dict[str, Path]:
    sheet = "target_id\tentity_type\tsequence\tmsa\tchain_ids\n" + "".join(
        f"{target}\tprotein\t{sequence}\t\t{chain}\n"
        for target, sequence, chain in [
            ("hemoglobin", ALPHA, "A"), ("hemoglobin", HEMOGLOBIN_BETA, "B"), ("alpha", ALPHA, "A"),
            ("lonely", NO_HIT, "A"),
        ]
    )  # fmt: skip
    (root / "targets.tsv").write_text(sheet)
    write_worklist(build_worklist([root / "targets.tsv"]), root / "worklist", True)
    return {"chains": root / "worklist" / "unique_chains.tsv", "worklist": root / "worklist" / "worklist.tsv"}


def stage(paths: dict[str, Path], staged: Path, config: MSAStagingConfig) -> staging.StagingResult:
    manifest, rejects = staged / "msa_manifest.tsv", staged / "msa_rejects.tsv"
    return stage_msas(paths["chains"], manifest, config, paths["worklist"], rejects)


@pytest.fixture(scope="module")
def run(database, tmp_path_factory):
    """The staging run, with the A3Ms its search returned."""
    root = tmp_path_factory.mktemp("paired")
    paths = write_run(root)
    config = MSAStagingConfig.from_config(
        {"mode": "search", "database": str(database.root), "threads": 2, "cache_dir": str(root / "cache")}
    )
    searched = {}
    search = staging.colabfold.search

    def recording(sequences, complexes, *args):
        searched["unpaired"], searched["paired"] = search(sequences, complexes, *args)
        return searched["unpaired"], searched["paired"]

    with mock.patch.object(staging.colabfold, "search", recording):
        result = stage(paths, root / "staged", config)
    targets = {target.target_id: target for target in load_worklist(paths["worklist"])}
    return {"root": root, "paths": paths, "config": config, "result": result, "targets": targets, **searched}


def test_complexes_get_paired_msas_in_the_manifest(run):
    manifest = read_msa_manifest(run["root"] / "staged" / "msa_manifest.tsv")
    group = complex_key(run["targets"]["hemoglobin"])
    assert group and complex_key(run["targets"]["alpha"]) == ""
    own, paired = manifest[manifest["complex"] == ""], manifest[manifest["complex"] == group]
    assert len(own) == 3 and len(paired) == 2  # alpha, beta, no-hit; alpha and beta paired
    assert set(manifest["source"]) == {"search"} and set(manifest["protocol"]) == {"colabfold"}
    assert (own["paired_rows"] == 0).all()
    rows = paired["paired_rows"].tolist()
    assert rows[0] == rows[1] > 100  # one row per species both chains have
    alpha_own = MSA.load(own["path"].iloc[0])
    alpha_paired = MSA.load(paired["path"].iloc[0])
    assert alpha_paired.keys[0] == "0" and (alpha_own.keys == "").all()
    assert (alpha_paired.residues[0] == alpha_own.residues[0]).all()
    assert own["depth"].tolist()[2] == 1  # no homolog: the query alone

    again = stage(run["paths"], run["root"] / "again", run["config"])
    assert again.searched == 0
    assert again.manifest.drop(columns="path").equals(run["result"].manifest.drop(columns="path"))


def test_paired_features_equal_oss_boltz_from_the_same_search(run, tmp_path):
    pytest.importorskip("boltz")
    pytest.importorskip("rdkit")
    import boltz.data.msa.mmseqs2 as boltz_mmseqs2
    from boltz.main import compute_msa

    import oss_oracle
    from oss_features_helper import oss_reference_features

    target = run["targets"]["hemoglobin"]
    hashes = {entity.sequence: entity.sequence_hash() for entity in target.entities}
    group = complex_key(target)

    def server_answer(sequences, prefix, use_env=True, use_pairing=False, **_):
        """What the MSA server answers boltz: the search's A3Ms of these sequences."""
        if use_pairing:
            return run["paired"][group]
        return [run["unpaired"][hashes[sequence]] for sequence in sequences]

    with mock.patch.object(boltz_mmseqs2, "run_mmseqs2", server_answer):
        compute_msa({"A": ALPHA, "B": HEMOGLOBIN_BETA}, "hemoglobin", tmp_path, "http://unused", "greedy")
    spec = {"version": 1, "sequences": [
        {"protein": {"id": chain, "sequence": sequence, "msa": str(tmp_path / f"{chain}.csv")}}
        for chain, sequence in (("A", ALPHA), ("B", HEMOGLOBIN_BETA))
    ]}  # fmt: skip
    (tmp_path / "hemoglobin.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    mols = oss_oracle.build_mols_dir([], tmp_path / "mols")

    reference = oss_reference_features(tmp_path / "hemoglobin.yaml", mols, seed=3, corrected_deletions=True)
    staged = StagedInputs.from_manifests(run["root"] / "staged", target)
    mine = featurize(target, staged, seed=3, mols_dir=mols).features
    assert reference["msa"].shape == mine["msa"].shape and reference["msa"].shape[1] > 1000
    for name in ("msa", "msa_paired", "deletion_value", "has_deletion", "deletion_mean", "profile", "msa_mask"):
        assert torch.equal(mine[name], reference[name]), f"{name} differs from OSS"
    paired = mine["msa_paired"][0, 1:]
    assert 0 < paired.float().mean() < 1  # paired rows lead, unpaired rows follow
    assert paired[:100].all()


def test_summary_names_protocol_pairing_and_no_hit(run, caplog):
    staged = run["root"] / "staged"
    folds = run["root"] / "fold.tsv"
    folds.write_text("target_id\tstatus\treason\tn_tokens\tseconds\treplica\tprediction_dir\n")
    summary = build_summary([folds], run["paths"]["worklist"], RunRecords.beside(run["paths"]["worklist"]))
    summary = summary.set_index("target_id")
    assert summary.loc["hemoglobin", "msa_protocol"] == "A:colabfold+paired,B:colabfold+paired"
    assert summary.loc["alpha", "msa_protocol"] == "A:colabfold"
    assert summary.loc["lonely", ["msa_depth", "msa_source"]].tolist() == ["A:1", "A:search"]
    assert int(summary.loc["hemoglobin", "min_msa_depth"]) > 1000
    with caplog.at_level(logging.WARNING):
        stage(run["paths"], staged.parent / "rerun", run["config"])
    lines = [record.getMessage() for record in caplog.records if "single-sequence MSAs" in record.getMessage()]
    assert lines == [f"msa: 1 of 3 protein chains (distinct sequence and MSA) have single-sequence MSAs "
                     f"(the search found no homolog in {run['config'].database})"]  # fmt: skip


@pytest.mark.parametrize("on_failure", ["reject", "fallback"])
def test_a_failed_pairing_rejects_or_falls_back_as_configured(run, tmp_path, on_failure):
    """The pairing step fails (no taxonomy mapping): the complex's targets are rejected, or fold from
    their unpaired MSAs, and the summary says so; the monomers are untouched."""
    database = tmp_path / "db"
    database.mkdir()
    for path in Path(run["config"].database).iterdir():  # links: the same database, so its cache serves
        if not path.name.endswith("_mapping"):
            (database / path.name).symlink_to(path)
    cache = tmp_path / "cache"
    shutil.copytree(run["root"] / "cache", cache, ignore=shutil.ignore_patterns("*.pair*", "colabfold-index"))
    config = MSAStagingConfig.from_config(
        {"mode": "search", "database": str(database), "threads": 2, "cache_dir": str(cache), "on_failure": on_failure}
    )
    staged = tmp_path / "staged"
    result = stage(run["paths"], staged, config)
    assert result.searched == 0
    folds = tmp_path / "fold.tsv"
    folds.write_text("target_id\tstatus\treason\tn_tokens\tseconds\treplica\tprediction_dir\n" + "".join(
        f"{target}\tfailed\tnot folded here\t1\t0\t\t\n" for target in ("hemoglobin", "alpha", "lonely")
    ))  # fmt: skip
    records = RunRecords(msa_manifest=staged / "msa_manifest.tsv", msa_rejects=staged / "msa_rejects.tsv")
    summary = build_summary([folds], run["paths"]["worklist"], records).set_index("target_id")
    assert summary.loc["alpha", "msa_source"] == "A:search" and summary.loc["alpha", "status"] == "failed"
    problem = "pairing complexes needs UniRef30's taxonomy mapping"
    if on_failure == "reject":
        assert len(result.rejects) == 2
        assert set(result.rejects["complex"]) == {complex_key(run["targets"]["hemoglobin"])}
        # the complex's targets only, not the monomer "alpha" that shares its chain A
        assert result.rejects["target_ids"].tolist() == ["hemoglobin", "hemoglobin"]
        assert summary.loc["hemoglobin", "status"] == "rejected"
        assert problem in summary.loc["hemoglobin", "status_reason"]
        assert "_mapping: missing" in result.rejects["problem"].iloc[0]
        assert summary.loc["hemoglobin", "msa_source"] == "A:rejected,B:rejected"
    else:
        assert result.rejects.empty
        assert summary.loc["hemoglobin", "msa_source"] == "A:fallback,B:fallback"
        assert summary.loc["hemoglobin", "msa_protocol"] == "A:colabfold,B:colabfold"
        assert "chain A: unpaired MSA fallback (unpaired only:" in summary.loc["hemoglobin", "warnings"]
        assert problem in summary.loc["hemoglobin", "warnings"]
        _, warnings = summary_notes(summary.reset_index())
        assert "1 target(s) folded with fallback MSAs (msa.on_failure; see the warnings column)" in warnings
        staged_inputs = StagedInputs.from_manifests(staged, run["targets"]["hemoglobin"])
        own = read_msa_manifest(run["root"] / "staged" / "msa_manifest.tsv")
        assert {path.name for path in staged_inputs.msa_paths.values()} == {Path(p).name for p in own["path"].iloc[:2]}
    assert pd.api.types.is_integer_dtype(result.manifest["paired_rows"])
