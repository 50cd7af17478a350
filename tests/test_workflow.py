"""The Snakemake workflow: lint, dry-run, config validation, and use as a module of another workflow."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

SNAKEMAKE = [sys.executable, "-m", "snakemake"]


def run_snakemake(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SNAKEMAKE, *args], cwd=cwd, capture_output=True, text=True)


def test_lint_is_clean(repo: Path) -> None:
    done = run_snakemake(["--lint"], repo)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Congratulations, your workflow is in a good condition!" in done.stdout + done.stderr


def test_dry_run_on_demo_config(repo: Path, tmp_path: Path) -> None:
    done = run_snakemake(["-n", "--configfile", "config/demo/config.yaml", "--config", f"outdir={tmp_path}/out"], repo)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "worklist" in done.stdout


def test_config_is_validated(repo: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("inputs: []\noutdir: out\n")
    done = run_snakemake(["-n", "--configfile", str(bad)], repo)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1].startswith("foldmill: error: config: inputs: empty (proteome FASTA")


def test_worklist_through_foldmill_as_a_module(repo: Path, tmp_path: Path, data_dir: Path) -> None:
    """A host workflow imports foldmill as a module; paths resolve against foldmill's source."""
    (tmp_path / "Snakefile").write_text(
        f"""configfile: "host.yaml"

module foldmill:
    snakefile: "{repo / 'Snakefile'}"
    config: config["foldmill"]

use rule * from foldmill as foldmill_*

rule all:
    input: "fm/worklist/worklist.tsv"
    default_target: True
"""
    )
    (tmp_path / "host.yaml").write_text(
        "foldmill:\n"
        "  outdir: fm\n"
        "  model: {checkpoint: demo}\n"
        f"  inputs: ['{data_dir / 'proteomes/yeast_chr1.fasta'}', '{data_dir / 'boltz_inputs/multimer.yaml'}']\n"
    )
    done = run_snakemake(["--cores", "1", "fm/worklist/worklist.tsv"], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    worklist = pd.read_csv(tmp_path / "fm/worklist/worklist.tsv", sep="\t")
    assert len(worklist) == 95
    assert worklist["target_id"].iloc[-1] == "multimer"
    assert (tmp_path / "fm/logs/worklist.log").exists()
    assert not (tmp_path / "results").exists(), "module outputs must go under the configured outdir"


@pytest.mark.parametrize("skip_bad", [True, False])
def test_bad_target_in_workflow(repo: Path, tmp_path: Path, skip_bad: bool) -> None:
    inputs = tmp_path / "in.fasta"
    inputs.write_text(">ok1\nMKTAYIAK\n>bad1\nMK2\n")
    config = tmp_path / "c.yaml"
    config.write_text(
        f"outdir: {tmp_path / 'out'}\ninputs: ['{inputs}']\nskip_bad: {str(skip_bad).lower()}\n"
        "model: {checkpoint: demo}\n"
    )
    target = str(tmp_path / "out/worklist/worklist.tsv")
    done = run_snakemake([target, "--cores", "1", "--configfile", str(config)], repo)
    if skip_bad:
        assert done.returncode == 0, done.stdout + done.stderr
        assert list(pd.read_csv(target, sep="\t")["target_id"]) == ["ok1"]
        rejects = pd.read_csv(tmp_path / "out/worklist/rejects.tsv", sep="\t")
        assert "unknown residue letter(s) '2'" in rejects["problem"][0]
    else:
        assert done.returncode != 0
        assert f"{inputs}: line 3 (bad1): protein chain A has unknown residue letter(s) '2'" in done.stderr
        assert not Path(target).exists()
