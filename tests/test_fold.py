"""`foldmill fold` and the workflow's `fold` rule, run as users run them (subprocesses, real Ray, demo model)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import gemmi
import numpy as np
import pandas as pd
import pytest
import yaml

from foldmill.executor.records import journal_path
from foldmill.io.worklist import build_worklist, write_worklist
from foldmill.outputs.summary import read_fold_table
from foldmill.outputs.writer import DONE_MARKER
from test_executor_ray import CI_DEMO_CONFIG

FOLDMILL = [sys.executable, "-m", "foldmill"]
CI_CONFIG = {
    "model": {
        "checkpoint": "demo",
        "device": "cpu",
        "demo_config": CI_DEMO_CONFIG,
        "recipe": {"recycling_steps": 0, "sampling_steps": 2, "diffusion_samples": 1, "max_parallel_samples": 1},
    },
    "executor": {"cpus": 2, "object_store_mb": 256, "progress_seconds": 5, "token_budget": 2000},
}


def foldmill(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FOLDMILL, *args], capture_output=True, text=True, cwd=cwd)


def done_dirs(outdir: Path) -> dict[str, tuple[int, int]]:
    """Finished target directories -> (inode, mtime) of their done marker."""
    found = {}
    for marker in (outdir / "predictions").glob(f"*/{DONE_MARKER}"):
        stat = marker.stat()
        found[marker.parent.name] = (stat.st_ino, stat.st_mtime_ns)
    return found


def assert_no_visible_partial_output(outdir: Path) -> None:
    for entry in (outdir / "predictions").iterdir():
        assert entry.name.startswith(".") or (entry / DONE_MARKER).exists(), f"partial output {entry}"


def test_fold_boltz_example_yaml_with_the_demo_model(data_dir: Path, tmp_path: Path) -> None:
    """`foldmill fold` on a Boltz example YAML with the demo model writes a structure."""
    example = data_dir / "boltz_inputs/prot.yaml"
    sequence = yaml.safe_load(example.read_text())["sequences"][0]["protein"]["sequence"]
    args = [str(example), "-o", str(tmp_path), "--model", "demo", "--device", "cpu", "--recycling-steps", "0",
            "--sampling-steps", "2"]  # fmt: skip
    done = foldmill("fold", *args)
    assert done.returncode == 0, done.stderr
    assert "ok 1 (0 from earlier runs), failed 0, rejected 0" in done.stderr
    structure = gemmi.read_structure(str(tmp_path / "predictions/prot/prot_model_0.cif"))
    chain = structure[0]["A"]
    assert gemmi.one_letter_code([residue.name for residue in chain]) == sequence
    coords = np.array([atom.pos.tolist() for residue in chain for atom in residue])
    assert np.isfinite(coords).all() and coords.std() > 0.1
    record = json.loads((tmp_path / "predictions/prot/prediction_prot.json").read_text())
    assert record["provenance"]["model"] == "demo"
    table = read_fold_table(tmp_path / "fold/fold.tsv")
    assert table[["target_id", "status", "replica"]].values.tolist() == [["prot", "ok", table["replica"][0]]]
    assert table["replica"][0].startswith("cpu0@")

    rerun = foldmill("fold", *args)  # everything finished: nothing folds again, Ray does not even start
    assert rerun.returncode == 0, rerun.stderr
    assert "ok 1 (1 from earlier runs)" in rerun.stderr and "starting a local Ray" not in rerun.stderr


def test_fold_errors_are_one_line(tmp_path: Path) -> None:
    missing = foldmill("fold", str(tmp_path / "nothing.yaml"), "-o", str(tmp_path / "out"), "--model", "demo")
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert missing.stderr.strip().splitlines()[-1].startswith("foldmill: error:") and "nothing.yaml" in missing.stderr
    bad = tmp_path / "bad.fasta"
    bad.write_text(">bad\nMK2\n")
    checkpoint = foldmill("fold", str(bad), "-o", str(tmp_path / "out"), "--skip-bad", "--model", str(tmp_path / "no.ckpt"))
    assert checkpoint.returncode == 2 and "no.ckpt: checkpoint not found" in checkpoint.stderr
    config = tmp_path / "c.yaml"
    config.write_text("executor: {queue_dept: 3}\n")
    typo = foldmill("fold", str(bad), "-o", str(tmp_path / "out"), "--config", str(config))
    assert typo.returncode == 2 and "unknown key 'queue_dept' (in executor; did you mean 'queue_depth'?)" in typo.stderr
    no_model = foldmill("fold", str(bad), "-o", str(tmp_path / "out"))
    assert no_model.returncode == 2 and "no model: give --model boltz2_conf.ckpt" in no_model.stderr


def test_interrupted_run_resumes_only_the_rest(data_dir: Path, tmp_path: Path) -> None:
    worklist = build_worklist([data_dir / "proteomes/yeast_chr1.fasta"])
    table = worklist.table[worklist.table["n_tokens"] <= 150].head(8)
    write_worklist(type(worklist)(worklist.targets, table, worklist.rejects), tmp_path / "wl", write_rejects=False)
    config = tmp_path / "ci.yaml"
    config.write_text(yaml.safe_dump(CI_CONFIG))
    out = tmp_path / "out"
    args = ["fold", "--worklist", str(tmp_path / "wl/worklist.tsv"), "-o", str(out), "--config", str(config)]

    first = subprocess.Popen([*FOLDMILL, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while len(done_dirs(out)) < 3 and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    first.send_signal(signal.SIGTERM)  # what Slurm sends at a time limit or scancel
    first.communicate(timeout=60)
    finished_first = done_dirs(out)
    assert 3 <= len(finished_first) < len(table), "the run was not interrupted mid-way"
    assert not (out / "fold/fold.tsv").exists()
    assert_no_visible_partial_output(out)

    second = foldmill(*args)
    assert second.returncode == 0, second.stderr
    assert f"{len(finished_first)} finished earlier, {len(table) - len(finished_first)} to fold" in second.stderr
    finished_second = done_dirs(out)
    assert set(finished_second) == set(table["target_id"])
    assert {k: finished_second[k] for k in finished_first} == finished_first, "a finished target was written again"
    runs: dict[str, set[str]] = {}
    for line in journal_path(out / "fold/fold.tsv").read_text().splitlines():
        record = json.loads(line)
        runs.setdefault(record["run"], set()).add(record["target_id"])
    assert runs[list(runs)[-1]] == set(table["target_id"]) - set(finished_first)
    fold_table = read_fold_table(out / "fold/fold.tsv")
    assert fold_table["target_id"].tolist() == table["target_id"].tolist()
    assert set(fold_table["status"]) == {"ok"}
    assert_no_visible_partial_output(out)


@pytest.mark.slow
def test_yeast_chromosome_folds_through_the_workflow(repo: Path, data_dir: Path, tmp_path: Path) -> None:
    """Acceptance: the 94-protein yeast chromosome I worklist folds with the demo model (reduced recipe)."""
    out = tmp_path / "results"
    config = tmp_path / "yeast.yaml"
    config.write_text(yaml.safe_dump({"outdir": str(out), "inputs": [str(data_dir / "proteomes/yeast_chr1.fasta")], **CI_CONFIG}))
    done = subprocess.run(
        [sys.executable, "-m", "snakemake", str(out / "summary.tsv"), "--cores", "2", "--configfile", str(config)],
        cwd=repo, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    tables = sorted((out / "fold").glob("shard_*.tsv"))
    folds = pd.concat([read_fold_table(path) for path in tables])
    assert len(folds) == 94 and folds["target_id"].is_unique
    assert set(folds["status"]) == {"ok"}, folds[folds["status"] != "ok"]
    assert len(done_dirs(out)) == 94
    summary = pd.read_csv(out / "summary.tsv", sep="\t")
    assert (summary["status"] == "ok").sum() == 94
    log = (out / "logs/fold" / f"{tables[0].stem}.log").read_text()
    assert "residues/s" in log and "fold run: " in log
