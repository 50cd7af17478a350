"""Run-level outputs: summary, confidence filters (threshold edges), export, CLI, and a real Snakemake run
of rules/outputs.smk on synthetic fold tables and predictions, with the report rendered."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from foldmill.cli import main as cli_main
from foldmill.errors import FoldmillError
from foldmill.io.atomic import read_ledger
from foldmill.io.worklist import build_worklist, write_worklist
from foldmill.msa.staging import MSAStagingConfig, stage_msas
from foldmill.outputs.export import ExportOptions, export_passing
from foldmill.outputs.filters import (
    FilterConfig,
    Thresholds,
    apply_filters,
    failure_counts,
    read_filter_result,
    write_filter_tables,
)
from foldmill.outputs.summary import SUMMARY_COLUMNS, build_summary, read_summary, write_summary
from foldmill.outputs.synthetic import synthetic_prediction
from foldmill.outputs.writer import DONE_MARKER, write_prediction
from foldmill.runtime.job_log import write_job_table
from foldmill.templates.staging import TemplateStagingConfig, stage_templates

REPO = Path(__file__).resolve().parents[1]

# Target sheet rows: target_id, entity_type, sequence, ccd, chain_ids.
SHEET = [
    ("mono_hi", "protein", "MKTAYIAKQRQISFVKSHFSRQ", "", "A"),
    ("mono_lo", "protein", "GSHMLEDPVDAFQ", "", "A"),
    ("cx_ok", "protein", "NLYIQWLKDGGPSSGRPPPS", "", "A,B"),
    ("cx_ok", "ligand", "", "SAH", "L"),
    ("cx_bad", "protein", "MKTAYIAKQR", "", "A"),
    ("cx_bad", "dna", "ACGTAC", "", "B"),
    ("failed1", "protein", "MSISFPKMQHLIVMT", "", "A"),
    ("rejected1", "protein", "MRLNYSRCYYSSQRR", "", "A"),
    ("missing1", "protein", "MSTTPA", "", "A"),
    ("incomplete1", "protein", "MQHLIVMTTIG", "", "A"),
]
# Best-sample metrics each folded target gets (sample 0 is made the best).
METRICS = {
    "mono_hi": dict(complex_plddt=0.91, ptm=0.82, iptm=0.0, chains_ptm=[0.82]),
    "mono_lo": dict(complex_plddt=0.55, ptm=0.61, iptm=0.0, chains_ptm=[0.61]),
    "cx_ok": dict(complex_plddt=0.88, ptm=0.79, iptm=0.74, chains_ptm=[0.81, 0.77, 0.30]),
    "cx_bad": dict(complex_plddt=0.72, ptm=0.52, iptm=0.31, chains_ptm=[0.66, 0.48]),
    "incomplete1": dict(complex_plddt=0.9, ptm=0.9, iptm=0.0, chains_ptm=[0.9]),
}
THRESHOLDS = {
    "monomer": {"min_plddt": 70, "min_ptm": 0.5, "min_iptm": None, "min_chain_ptm": None, "max_interface_pae": None},
    "complex": {"min_plddt": 70, "min_ptm": 0.5, "min_iptm": 0.6, "min_chain_ptm": 0.5, "max_interface_pae": None},
}


def _chains(target_id: str) -> list[tuple[str, str, str]]:
    chains = []
    for tid, entity_type, sequence, ccd, chain_ids in SHEET:
        if tid == target_id:
            chains += [(chain, entity_type, sequence or ccd) for chain in chain_ids.split(",")]
    return chains


def _prediction(target_id: str):
    metrics = METRICS[target_id]
    p = synthetic_prediction(target_id, _chains(target_id), n_samples=2, seed=len(target_id))
    n_chains = len(metrics["chains_ptm"])
    pair = np.full((2, n_chains, n_chains), 0.2)
    pair[0] = np.where(np.eye(n_chains, dtype=bool), np.diag(metrics["chains_ptm"]), 0.4)
    if n_chains > 1:
        pair[0, 0, 1] = pair[0, 1, 0] = 0.55
    return dataclasses.replace(
        p,
        complex_plddt=np.array([metrics["complex_plddt"], metrics["complex_plddt"] - 0.2]),
        ptm=np.array([metrics["ptm"], 0.1]),
        iptm=np.array([metrics["iptm"], 0.0]),
        chains_ptm=np.stack([np.array(metrics["chains_ptm"]), np.full(n_chains, 0.2)]),
        pair_chains_iptm=pair,
    )


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A workdir as the fold rule would leave it: worklist (one record refused), staged MSAs and
    templates, shards, two fold tables with their job tables, predictions."""
    root = tmp_path_factory.mktemp("run")
    sheet = root / "targets.tsv"
    lines = ["target_id\tentity_type\tsequence\tccd\tchain_ids\tmsa"] + ["\t".join(row) + "\tempty" for row in SHEET]
    sheet.write_text("\n".join([*lines, "bad_letter\tprotein\tMK2\t\tA\tempty"]) + "\n")
    out = root / "out"
    write_worklist(build_worklist([sheet], skip_bad=True), out / "worklist", write_rejects=True)
    worklist, staged = out / "worklist" / "worklist.tsv", out / "staged"
    msa_config = MSAStagingConfig(mode="single_sequence")
    stage_msas(out / "worklist" / "unique_chains.tsv", staged / "msa_manifest.tsv", msa_config, worklist,
               staged / "msa_rejects.tsv")  # fmt: skip
    template_config = TemplateStagingConfig()
    stage_templates(worklist, staged / "templates_manifest.tsv", template_config, staged / "templates_rejects.tsv")
    (out / "shards").mkdir()
    predictions = {}
    for target_id in METRICS:
        predictions[target_id] = _prediction(target_id)
        write_prediction(predictions[target_id], out, top_k=2)
    (out / "predictions" / "incomplete1" / DONE_MARKER).unlink()
    rows = [
        ("mono_hi", "ok", "", 22, 12.5, "0"),
        ("mono_lo", "ok", "", 13, 8.0, "0"),
        ("cx_ok", "ok", "", 66, 30.0, "1"),
        ("cx_bad", "ok", "", 16, 9.5, "1"),
        ("failed1", "failed", "CUDA out of memory", 15, 2.0, "0"),
        ("rejected1", "rejected", "non-finite coordinates (NaN/inf) in sample(s) [0]", 15, 3.0, "1"),
        ("incomplete1", "ok", "", 11, 4.0, "1"),
    ]
    (out / "fold").mkdir()
    for shard, members in (("shard_0000", rows[:4]), ("shard_0001", rows[4:])):
        (out / "shards" / f"{shard}.tsv").write_text("target_id\n")
        table = pd.DataFrame(members, columns=["target_id", "status", "reason", "n_tokens", "seconds", "replica"])
        table["prediction_dir"] = [f"out/predictions/{t}" if s == "ok" else "" for t, s, *_ in members]
        table.to_csv(out / "fold" / f"{shard}.tsv", sep="\t", index=False)
        (out / "logs" / "fold").mkdir(parents=True, exist_ok=True)
        write_job_table(out / "fold" / f"{shard}.tsv", shard, out / "logs" / "fold" / f"{shard}.jobs.tsv", environ={})
    return root, predictions


@pytest.fixture()
def in_run_dir(run_dir, monkeypatch):
    monkeypatch.chdir(run_dir[0])
    return run_dir


def _summary(root: Path) -> pd.DataFrame:
    return build_summary(sorted((root / "out" / "fold").glob("*.tsv")), root / "out" / "worklist" / "worklist.tsv")


def test_summary_rows(in_run_dir):
    root, predictions = in_run_dir
    table = _summary(root).set_index("target_id")
    assert list(table.index) == list(dict.fromkeys(row[0] for row in SHEET))  # worklist order
    assert table.loc["missing1", "status"] == "missing"
    assert table.loc["failed1", ["status", "status_reason"]].tolist() == ["failed", "CUDA out of memory"]
    assert table.loc["rejected1", "status"] == "rejected"
    assert (
        table.loc["incomplete1", "status"] == "failed"
        and "no 'done' marker" in table.loc["incomplete1", "status_reason"]
    )
    cx = table.loc["cx_ok"]
    assert (cx["target_type"], cx["n_chains"], cx["n_residues"], cx["chain_lengths"]) == (
        "complex",
        3,
        41,
        "A:20,B:20,L:1",
    )
    assert cx["composition"] == "protein:2,ligand:1" and cx["n_tokens"] == 40 + 26
    p = predictions["cx_ok"]
    for key in (
        "ptm",
        "iptm",
        "ligand_iptm",
        "protein_iptm",
        "complex_plddt",
        "complex_iplddt",
        "complex_pde",
        "complex_ipde",
    ):
        assert cx[key] == round(float(getattr(p, key)[0]), 6), key
    assert cx["confidence_score"] == round((4 * 0.88 + 0.74) / 5, 6)
    assert cx["chains_ptm"] == "A:0.8100,B:0.7700,L:0.3000"
    assert cx["min_chain_ptm"] == 0.77  # the ligand's pTM does not count
    assert cx["min_pair_iptm"] == 0.4 and cx["mean_pair_iptm"] == round((0.55 * 2 + 0.4 * 4) / 6, 6)
    record = json.loads((root / "out/predictions/cx_ok/prediction_cx_ok.json").read_text())
    assert cx["interface_pae"] == round(record["models"][0]["interface_pae"], 6) and cx["interface_contacts"] > 0
    assert cx["n_models"] == 2 and cx["best_model"] == "out/predictions/cx_ok/cx_ok_model_0.cif"
    assert (cx["model"], cx["seed"], cx["seconds"], cx["replica"]) == ("demo", "5", 30.0, "1")
    mono = table.loc["mono_hi"]
    assert mono["target_type"] == "monomer" and np.isnan(mono["interface_pae"]) and np.isnan(mono["min_pair_iptm"])
    assert mono["iptm"] == 0.0 and mono["confidence_score"] == round((4 * 0.91 + 0.82) / 5, 6)


def test_summary_tsv_and_parquet_agree(in_run_dir, tmp_path):
    table = _summary(in_run_dir[0])
    write_summary(table, tmp_path / "summary.tsv", tmp_path / "summary.parquet")
    from_tsv, from_parquet = read_summary(tmp_path / "summary.tsv"), read_summary(tmp_path / "summary.parquet")
    assert list(from_tsv.columns) == SUMMARY_COLUMNS
    pd.testing.assert_frame_equal(from_tsv, from_parquet, check_dtype=False)
    pd.testing.assert_frame_equal(from_tsv, table, check_dtype=False)


def test_bad_fold_table_is_a_one_line_error(in_run_dir, tmp_path):
    bad = tmp_path / "shard_0009.tsv"
    bad.write_text("target_id\tstatus\nx\tok\n")
    with pytest.raises(FoldmillError, match="fold table lacks column"):
        build_summary([bad], in_run_dir[0] / "out/worklist/worklist.tsv")
    bad.write_text("target_id\tstatus\treason\tn_tokens\tseconds\treplica\tprediction_dir\nx\tdone\t\t1\t1\t0\t\n")
    with pytest.raises(FoldmillError, match="unknown status 'done'"):
        build_summary([bad], in_run_dir[0] / "out/worklist/worklist.tsv")


# --- filters: decisions at the threshold edges -------------------------------------------------


def _row(**values) -> dict:
    row = {column: np.nan for column in SUMMARY_COLUMNS}
    row.update(target_id="t", status="ok", status_reason="", target_type="complex")
    row.update(values)
    return row


def _decide(thresholds: dict, **values) -> tuple[bool, str, str]:
    config = FilterConfig.from_config({"complex": thresholds, "monomer": thresholds})
    result = apply_filters(pd.DataFrame([_row(**values)], columns=SUMMARY_COLUMNS), config).iloc[0]
    return bool(result["passed"]), result["failed_filters"], result["reason"]


@pytest.mark.parametrize(
    ("name", "column", "threshold", "at", "beyond"),
    [
        ("min_plddt", "complex_plddt", 70, 0.7, np.nextafter(0.7, 0)),
        ("min_plddt", "complex_plddt", 57, 0.57, 0.569999),  # 0.57 * 100 < 57 in floats: compared as 0.57 >= 57/100
        ("min_ptm", "ptm", 0.5, 0.5, np.nextafter(0.5, 0)),
        ("min_iptm", "iptm", 0.6, 0.6, 0.599999),
        ("min_chain_ptm", "min_chain_ptm", 0.45, 0.45, 0.449999),
        ("max_interface_pae", "interface_pae", 10, 10.0, np.nextafter(10.0, 11)),
    ],
)
def test_threshold_edges_are_inclusive(name, column, threshold, at, beyond):
    assert _decide({name: threshold}, **{column: at}) == (True, "", "")
    passed, failed, reason = _decide({name: threshold}, **{column: beyond})
    assert (passed, failed) == (False, name)
    assert reason.endswith(f"{'>' if name.startswith('max') else '<'} {threshold:g}")


def test_unset_thresholds_are_not_applied_and_reasons_list_every_failure():
    assert _decide({}, complex_plddt=0.01, ptm=0.0)[0]
    passed, failed, reason = _decide(
        {"min_plddt": 80, "min_ptm": 0.9, "max_interface_pae": 5}, complex_plddt=0.6543, ptm=0.3
    )
    assert (passed, failed) == (False, "min_plddt,min_ptm,max_interface_pae")
    assert reason == "pLDDT 65.43 < 80; pTM 0.3 < 0.9; interface PAE not available (max_interface_pae 5)"


def test_thresholds_apply_per_target_type_and_status():
    rows = [
        _row(target_id="m", target_type="monomer", complex_plddt=0.6, ptm=0.9, iptm=0.0),
        _row(target_id="c", target_type="complex", complex_plddt=0.6, ptm=0.9, iptm=0.0),
        _row(target_id="f", target_type="complex", status="failed", status_reason="CUDA out of memory"),
        _row(target_id="x", target_type="monomer", status="missing", status_reason=""),
    ]
    config = FilterConfig(monomer=Thresholds(min_plddt=50), complex=Thresholds(min_plddt=50, min_iptm=0.1))
    result = apply_filters(pd.DataFrame(rows, columns=SUMMARY_COLUMNS), config).set_index("target_id")
    assert result["passed"].to_dict() == {"m": True, "c": False, "f": False, "x": False}
    assert result.loc["c", "reason"] == "ipTM 0 < 0.1"
    assert (
        result.loc["f", "reason"] == "status failed: CUDA out of memory"
        and result.loc["f", "failed_filters"] == "status"
    )
    assert result.loc["x", "reason"] == "status missing"
    assert failure_counts(result.reset_index()) == {
        "status": 2, "min_plddt": 0, "min_ptm": 0, "min_iptm": 1, "min_chain_ptm": 0, "max_interface_pae": 0,
    }  # fmt: skip


def test_filter_config_rejects_unknown_keys():
    with pytest.raises(FoldmillError, match="unknown threshold 'min_pldt'"):
        FilterConfig.from_config({"complex": {"min_pldt": 70}})


# --- filter tables and export on the synthetic run ---------------------------------------------


@pytest.fixture()
def filtered(in_run_dir, tmp_path):
    result = apply_filters(_summary(in_run_dir[0]), FilterConfig.from_config(THRESHOLDS))
    write_filter_tables(result, tmp_path / "passed.tsv", tmp_path / "failed.tsv")
    return read_filter_result(tmp_path / "passed.tsv", tmp_path / "failed.tsv")


def test_filter_decisions_on_the_run(filtered):
    decisions = filtered.set_index("target_id")[["passed", "reason"]]
    assert decisions["passed"].to_dict() == {
        "mono_hi": True, "mono_lo": False, "cx_ok": True, "cx_bad": False,
        "failed1": False, "rejected1": False, "missing1": False, "incomplete1": False,
    }  # fmt: skip
    assert decisions.loc["mono_lo", "reason"] == "pLDDT 55 < 70"
    assert decisions.loc["cx_bad", "reason"] == "ipTM 0.31 < 0.6; per-chain pTM 0.48 < 0.5"
    assert decisions.loc["rejected1", "reason"] == "status rejected: non-finite coordinates (NaN/inf) in sample(s) [0]"


def test_export_folder(in_run_dir, filtered, tmp_path):
    export = tmp_path / "export"
    options = ExportOptions(top_k=2, include_arrays=True)
    assert export_passing(filtered, export, FilterConfig.from_config(THRESHOLDS), options) == 2
    manifest = pd.read_csv(export / "manifest.tsv", sep="\t")
    files = sorted(
        p.relative_to(export).as_posix()
        for p in export.rglob("*")
        if p.is_file() and p.name not in ("manifest.tsv", ".foldmill-export")
    )
    assert manifest["path"].tolist() == files
    assert set(files) | {"manifest.tsv"} <= read_ledger(export, "export")  # the export's own files, all listed
    for path, digest in zip(manifest["path"], manifest["sha256"]):
        assert hashlib.sha256((export / path).read_bytes()).hexdigest() == digest
    structures = {p.parent.name for p in (export / "structures").rglob("*.cif")}
    assert structures == {"mono_hi", "cx_ok"}
    cx_files = sorted(p.name for p in (export / "structures" / "cx_ok").iterdir())
    assert cx_files == sorted(
        [f"{kind}cx_ok_model_{rank}.{ext}" for rank in (0, 1)
         for kind, ext in (("", "cif"), ("confidence_", "json"), ("plddt_", "npz"), ("pae_", "npz"), ("pde_", "npz"))]
        + ["prediction_cx_ok.json"]
    )  # fmt: skip
    source = in_run_dir[0] / "out/predictions/cx_ok/cx_ok_model_0.cif"
    assert (export / "structures/cx_ok/cx_ok_model_0.cif").read_bytes() == source.read_bytes()
    assert read_summary(export / "summary.tsv")["target_id"].tolist() == ["mono_hi", "cx_ok"]
    readme = (export / "README.md").read_text()
    assert "2 of 8 targets passed" in readme and "NOT a trained model" in readme
    assert "| min_iptm (ipTM) | - | 0.6 | 1 |" in readme and "| min_plddt (pLDDT) | 70 | 70 | 1 |" in readme
    assert "4 target(s) did not fold" in readme


def test_cli_summary_filter_export(in_run_dir, tmp_path, capsys):
    root = in_run_dir[0]
    folds = [str(p) for p in sorted((root / "out/fold").glob("*.tsv"))]
    assert (
        cli_main(["summary", *folds, "--worklist", str(root / "out/worklist/worklist.tsv"), "-o", str(tmp_path)]) == 0
    )
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"filters": THRESHOLDS}))
    args = ["--config", str(config), "--set", "complex.min_iptm=0.3", "--set", "complex.min_chain_ptm=null"]
    assert cli_main(["filter", str(tmp_path / "summary.parquet"), "-o", str(tmp_path / "filter"), *args]) == 0
    assert "3 of 9 targets passed" in capsys.readouterr().out  # the refused record counts
    passed = pd.read_csv(tmp_path / "filter/passed.tsv", sep="\t")["target_id"].tolist()
    assert passed == ["mono_hi", "cx_ok", "cx_bad"]
    assert cli_main(["export", str(tmp_path / "filter"), "-o", str(tmp_path / "export"), "--tar-gz", *args]) == 0
    with tarfile.open(tmp_path / "export.tar.gz") as tar:
        assert "export/manifest.tsv" in tar.getnames()
    assert cli_main(["filter", str(tmp_path / "nope.tsv"), "-o", str(tmp_path)]) == 2
    assert cli_main(["filter", str(tmp_path / "summary.tsv"), "-o", str(tmp_path), "--set", "complex.min_iptm"]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 2 and all(line.startswith("foldmill: error: ") for line in errors)


# --- the Snakemake rules and the report ----------------------------------------------------------

SNAKEFILE = """\
configfile: "config.yaml"


include: "{repo}/rules/common.smk"


def shard_ids(wildcards):
    # Stands in for rules/shards.smk: the shards the checkpoint wrote.
    return sorted(p.stem for p in (OUTDIR / "shards").glob("shard_*.tsv"))


include: "{repo}/rules/outputs.smk"


rule all:
    input:
        lambda wildcards: FINAL_OUTPUTS,
    default_target: True
"""


def _snakemake(root: Path, *args: str) -> str:
    command = [str(Path(sys.executable).with_name("snakemake")), "--cores", "2", "--directory", str(root), *args]
    done = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


def _rules_run(log: str) -> set[str]:
    """Names of the rules whose jobs a run executed."""
    return set(re.findall(r"^(?:local)?rule (\w+):$", log, re.M))


def _write_config(root: Path, thresholds: dict, tar_gz: bool) -> None:
    config = {"outdir": "out", "inputs": ["targets.tsv"], "model": {"checkpoint": "demo"}, "filters": thresholds,
              "export": {"tar_gz": tar_gz}}  # fmt: skip
    (root / "config.yaml").write_text(yaml.safe_dump(config))


def test_snakemake_rules_rerun_on_thresholds_and_render_the_report(run_dir):
    root = run_dir[0]
    (root / "Snakefile").write_text(SNAKEFILE.format(repo=REPO))
    _write_config(root, THRESHOLDS, tar_gz=False)
    assert _rules_run(_snakemake(root)) == {"summary", "filter", "export", "report_figures", "report", "all"}
    out = root / "out"
    for path in ("summary.tsv", "summary.parquet", "filter/passed.tsv", "filter/failed.tsv", "export/manifest.tsv",
                 "export/README.md", "report/plddt_distribution.png", "report/targets.html",
                 "report.html"):  # fmt: skip
        assert (out / path).is_file(), path
    assert pd.read_csv(out / "filter/passed.tsv", sep="\t")["target_id"].tolist() == ["mono_hi", "cx_ok"]
    assert not (out / "export.tar.gz").exists()
    summary_mtime = (out / "summary.tsv").stat().st_mtime_ns

    # New thresholds: only filter, export (and the figures that show the decisions) rerun.
    looser = {**THRESHOLDS, "complex": {**THRESHOLDS["complex"], "min_iptm": 0.3, "min_chain_ptm": 0.4}}
    _write_config(root, looser, tar_gz=True)
    assert _rules_run(_snakemake(root)) == {"filter", "export", "export_archive", "report_figures", "report", "all"}
    assert (out / "summary.tsv").stat().st_mtime_ns == summary_mtime
    assert pd.read_csv(out / "filter/passed.tsv", sep="\t")["target_id"].tolist() == ["mono_hi", "cx_ok", "cx_bad"]
    assert "| min_iptm (ipTM) | - | 0.3 | 0 |" in (out / "export/README.md").read_text()
    with tarfile.open(out / "export.tar.gz") as tar:
        manifest = pd.read_csv(out / "export/manifest.tsv", sep="\t")["path"]
        assert sorted(tar.getnames()) == sorted(
            {"export", "export/structures", *(f"export/structures/{t}" for t in ("mono_hi", "cx_ok", "cx_bad")),
             "export/manifest.tsv", *(f"export/{p}" for p in manifest)}
        )  # fmt: skip

    _snakemake(root, "--report", "report.html")
    html = (root / "report.html").read_text()
    results = json.loads(re.search(r"var results = (\{.*?\});\n", html, re.S).group(1))
    by_name = {Path(key).name: value for key, value in results.items()}
    assert sorted(by_name) == [
        "filter_counts.png",
        "plddt_distribution.png",
        "ptm_vs_iptm.png",
        "targets.html",
        "throughput.png",
    ]
    for name, entry in by_name.items():
        payload = base64.b64decode(entry["data_uri"].split("base64,", 1)[1])
        assert payload == (out / "report" / name).read_bytes(), name
        assert entry["caption"].strip(), name
    assert base64.b64decode(by_name["ptm_vs_iptm.png"]["data_uri"].split("base64,", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    table = base64.b64decode(by_name["targets.html"]["data_uri"].split("base64,", 1)[1]).decode()
    assert "3 of 9 targets passed" in table and all(f"<td>{t}</td>" in table for t in METRICS)
    summary = read_summary(out / "summary.tsv").set_index("target_id")
    refused = summary.loc["bad_letter"]
    assert refused["status"] == "rejected" and "unknown residue" in refused["status_reason"]
    assert summary.loc["mono_hi", ["msa_depth", "msa_source"]].tolist() == ["A:1", "A:single_sequence"]
    assert "min_iptm</tt> 0.3" in html  # the workflow description states the thresholds used
    assert "This run used the demo model with random weights: NOT a trained model" in html
