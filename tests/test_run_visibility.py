"""Nothing hidden in a run's outputs, through a real Snakemake run of the workflow (demo model, CPU).

The run (conftest's `workflow_run`, tests/demo_workflow.py) folds targets chosen to exercise what a user
must be told: records refused by the worklist, a user MSA that does not match its sequence (given by one
of two targets with that sequence), a good user MSA given by one of two targets with the same sequence,
and a user template naming a chain its file lacks. Every target given must appear in summary.tsv with its
status and reason; MSA depth and source per chain must be right; the demo model must be announced in the
summary, the report and the export README; the single-sequence MSA warning must appear once.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pandas as pd
import pytest
from Bio import SeqIO

from demo_workflow import WorkflowRun
from foldmill.io.targets import Entity
from foldmill.msa.staging import read_msa_manifest
from foldmill.provenance import DEMO_WARNING

SINGLE_SEQUENCE_WARNING = (
    "msa: 5 of 6 protein chains (distinct sequence and MSA) have single-sequence MSAs "
    "(msa.mode is auto and no msa.database is set)"
)


@pytest.fixture()
def run(workflow_run: WorkflowRun) -> dict:
    return {"out": workflow_run.out, "summary": workflow_run.summary, "console": workflow_run.console,
            "hemoglobin": workflow_run.hemoglobin}  # fmt: skip


def test_every_target_given_has_a_row_with_status_and_reason(run: dict) -> None:
    summary = run["summary"]
    assert sorted(summary.index) == sorted(["prot1", "prot2", "bad1", "hb_user", "hb_plain", "bad_user", "bad_plain",
                                            "template_bad", "broken"])  # fmt: skip
    statuses = summary["status"].to_dict()
    assert statuses == {
        "prot1": "ok", "prot2": "ok", "bad1": "rejected",
        "hb_user": "ok", "hb_plain": "ok", "bad_user": "rejected", "bad_plain": "ok", "template_bad": "ok",
        "broken": "rejected",
    }  # fmt: skip
    broken = summary.loc["broken"]
    assert broken["status_reason"].startswith("input rejected: protein chain A has unknown residue letter(s) '2'")
    assert broken["source"].endswith("targets.tsv:line 7 (broken)")
    # The bad MSA rejects only the target that gave it, naming the file and the problem.
    reason = summary.loc["bad_user", "status_reason"]
    assert reason.startswith("MSA of chain A rejected: ") and "seq2.a3m" in reason and "query" in reason
    assert summary.loc["bad_plain", "msa_source"] == "A:single_sequence"
    assert summary.loc["bad_user", ["msa_depth", "msa_source"]].tolist() == ["A:0", "A:rejected"]


def test_rejected_template_is_a_warning_of_a_folded_target(run: dict) -> None:
    warnings = run["summary"].loc["template_bad", "warnings"]
    assert "templates not used: " in warnings and "1aki.cif" in warnings and "no protein chain Z" in warnings
    rejects = pd.read_csv(run["out"] / "staged/templates_rejects.tsv", sep="\t", dtype=str)
    assert rejects["target_id"].tolist() == ["template_bad"]


def test_msa_depth_and_source_per_chain(run: dict, data_dir: Path) -> None:
    """A user MSA serves only the target that gave it; the same sequence without one is single-sequence."""
    a3m = data_dir / "msas" / "1a00_A_uniref90.a3m"
    # Rows counted independently: Biopython's records, a row repeating an earlier sequence dropped (as Boltz).
    records = SeqIO.parse(a3m, "fasta-blast")
    depth = len({str(r.seq).replace("-", "").upper() for r in records})
    assert depth == 3348
    summary = run["summary"]
    columns = ["msa_depth", "msa_source", "min_msa_depth"]
    assert summary.loc["hb_user", columns].tolist() == [f"A:{depth}", "A:user", depth]
    assert summary.loc["hb_plain", columns].tolist() == ["A:1", "A:single_sequence", 1]
    # The staging manifest holds two MSAs for the hemoglobin sequence, one per MSA given with it.
    manifest = read_msa_manifest(run["out"] / "staged/msa_manifest.tsv")
    chain_hash = Entity("protein", ("A",), sequence=run["hemoglobin"]).sequence_hash()
    staged = manifest[manifest["chain_hash"] == chain_hash].set_index("given_msa")
    assert staged[["depth", "source"]].to_dict("index") == {
        str(a3m): {"depth": depth, "source": "user"}, "": {"depth": 1, "source": "single_sequence"}
    }


def test_single_sequence_warning_once_with_its_count(run: dict) -> None:
    assert run["console"].count("have single-sequence MSAs") == 1
    assert SINGLE_SEQUENCE_WARNING in run["console"]
    assert SINGLE_SEQUENCE_WARNING in (run["out"] / "logs/stage_msas.log").read_text()


def test_demo_model_announced_in_summary_report_and_export(run: dict) -> None:
    summary = run["summary"]
    folded = summary[summary["status"] == "ok"]
    assert (folded["model"] == "demo").all() and folded["warnings"].str.startswith(DEMO_WARNING).all()
    assert f"summary: 6 target(s) folded by the {DEMO_WARNING}" in run["console"]
    assert "summary: 9 targets (6 ok, 3 rejected)" in (run["out"] / "logs/summary.log").read_text()
    report = (run["out"] / "report/targets.html").read_text()
    assert f"<p class='demo'>WARNING: 6 target(s) folded by the {DEMO_WARNING}.</p>" in report
    readme = (run["out"] / "export/README.md").read_text()
    assert f"> **WARNING: 6 target(s) folded by the {DEMO_WARNING}.**" in readme.splitlines()
    assert "3 target(s) did not fold" in readme and "of 9 targets passed" in readme


def test_summary_and_report_say_which_shard_job_and_node_folded_each_target(run: dict) -> None:
    """The per-shard job tables (logs/fold/<shard>.jobs.tsv) reach the summary and the report; outside
    Slurm the job id is empty and the node is this machine."""
    tables = sorted((run["out"] / "logs/fold").glob("shard_*.jobs.tsv"))
    jobs = pd.concat(pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False) for path in tables)
    summary = run["summary"]
    folded = summary[summary["status"] == "ok"]
    assert len(folded) == 6 and set(folded.index) <= set(jobs["target_id"])
    by_target = jobs.set_index("target_id")
    for target_id, row in folded.iterrows():
        assert row[["shard", "job_id", "node"]].tolist() == by_target.loc[target_id, ["shard", "job_id", "node"]].tolist()
        assert row["shard"].startswith("shard_") and row["job_id"] == "" and row["node"] == socket.gethostname().split(".")[0]
    assert summary.loc["broken", ["shard", "job_id", "node"]].tolist() == ["", "", ""]  # never reached a fold job
    report = (run["out"] / "report/targets.html").read_text()
    assert "<th>Slurm job</th>" in report and "<th>node</th>" in report and folded["shard"].iloc[0] in report
