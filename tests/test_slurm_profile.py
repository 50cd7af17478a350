"""profiles/slurm without a cluster: it renders from the environment, passes --lint, and plans a
20,000-target proteome as at most 100 GPU jobs (dry-run)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yte

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
PROFILE_ENV = (
    "FOLDMILL_SLURM_ACCOUNT",
    "FOLDMILL_CPU_PARTITION",
    "FOLDMILL_GPU_PARTITION",
    "FOLDMILL_GPU_MODEL",
    "FOLDMILL_CPUS_PER_GPU",
    "FOLDMILL_SLURM_STATUS_COMMAND",
)


def render_profile(monkeypatch: pytest.MonkeyPatch, **environ: str) -> dict:
    for name in PROFILE_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    with open(REPO / "profiles/slurm/config.yaml") as stream:
        return yte.process_yaml(stream, require_use_yte=True)


def test_profile_defaults_leave_account_and_cpu_partition_to_the_cluster(monkeypatch):
    profile = render_profile(monkeypatch)
    assert profile["executor"] == "slurm"
    assert profile["slurm-status-command"] == "squeue"
    assert "slurm_account" not in profile["default-resources"]
    assert "slurm_partition" not in profile["default-resources"]
    assert profile["set-resources"]["fold"] == {"slurm_partition": "gpu", "cpus_per_gpu": 8}


def test_profile_takes_cluster_settings_from_the_environment(monkeypatch):
    profile = render_profile(
        monkeypatch,
        FOLDMILL_SLURM_ACCOUNT="lab42",
        FOLDMILL_CPU_PARTITION="short",
        FOLDMILL_GPU_PARTITION="h100",
        FOLDMILL_GPU_MODEL="h100",
        FOLDMILL_CPUS_PER_GPU="12",
        FOLDMILL_SLURM_STATUS_COMMAND="sacct",
    )
    assert profile["default-resources"]["slurm_account"] == "lab42"
    assert profile["default-resources"]["slurm_partition"] == "short"
    assert profile["set-resources"]["fold"] == {"slurm_partition": "h100", "cpus_per_gpu": 12, "gpu_model": "h100"}
    assert profile["slurm-status-command"] == "sacct"


def test_profile_passes_lint():
    result = subprocess.run(
        [*SNAKEMAKE, "--lint", "--profile", "profiles/slurm"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Lints for" not in output, output
    assert "Congratulations, your workflow is in a good condition" in output


def synthetic_proteome(path: Path, count: int, seed: int = 0) -> int:
    """`count` random proteins, log-normal lengths like a real proteome (median ~420); returns the residues."""
    rng = np.random.default_rng(seed)
    letters = np.frombuffer(b"ACDEFGHIKLMNPQRSTVWY", dtype=np.uint8)
    lengths = np.clip(rng.lognormal(np.log(420), 0.6, count).astype(int), 30, 5000)
    residues = letters[rng.integers(0, len(letters), int(lengths.sum()))].tobytes().decode()
    ends = np.cumsum(lengths)
    with open(path, "w") as fasta:
        for index, (end, length) in enumerate(zip(ends, lengths)):
            fasta.write(f">SYN{index:05d}\n{residues[end - length:end]}\n")
    return int(lengths.sum())


def job_counts(snakemake_output: str) -> dict[str, int]:
    table = snakemake_output.split("Job stats:", 1)[1].split("total", 1)[0]
    return {name: int(count) for name, count in re.findall(r"^(\w+)\s+(\d+)\s*$", table, flags=re.MULTILINE)}


@pytest.mark.slow
def test_proteome_of_20000_targets_plans_at_most_100_gpu_jobs(tmp_path, monkeypatch):
    residues = synthetic_proteome(tmp_path / "proteome.fasta", 20_000)
    config = tmp_path / "config.yaml"
    config.write_text(
        f"outdir: {tmp_path / 'results'}\ninputs: [{tmp_path / 'proteome.fasta'}]\nmodel: {{checkpoint: demo}}\n"
    )
    common = ["-s", str(REPO / "Snakefile"), "--directory", str(tmp_path), "--configfile", str(config)]
    # The shard count is known once the `shards` checkpoint ran: build worklist and shards here.
    built = subprocess.run(
        [*SNAKEMAKE, *common, "--cores", "2", str(tmp_path / "results/shards")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    for name in PROFILE_ENV:
        monkeypatch.delenv(name, raising=False)
    started = time.monotonic()
    result = subprocess.run(
        [*SNAKEMAKE, *common, "--profile", str(REPO / "profiles/slurm"), "-n"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "FOLDMILL_SLURM_ACCOUNT": "lab42"},
    )
    planning_seconds = time.monotonic() - started
    assert result.returncode == 0, result.stdout + result.stderr

    counts = job_counts(result.stdout)
    shards = sorted((tmp_path / "results/shards").glob("shard_*.tsv"))
    assert counts["fold"] == len(shards) == -(-residues // 200_000)  # the default token budget
    assert counts["fold"] <= 100
    # Every fold job asks the GPU partition for a GPU, with memory and runtime sized per shard.
    fold_resources = re.findall(r"rule fold:.*?resources: ([^\n]*)", result.stdout, flags=re.DOTALL)
    assert len(fold_resources) == counts["fold"]
    assert all("gpu=1" in line and "slurm_partition=gpu" in line for line in fold_resources)
    assert len({re.search(r"mem_mb=(\d+)", line).group(1) for line in fold_resources}) > 1
    print(f"20,000 targets ({residues:,} residues): {counts['fold']} fold jobs, planned in {planning_seconds:.1f} s")


def test_local_profile_shares_the_configured_gpus(monkeypatch):
    monkeypatch.delenv("FOLDMILL_LOCAL_GPUS", raising=False)
    with open(REPO / "profiles/local/config.yaml") as stream:
        assert yte.process_yaml(stream, require_use_yte=True)["resources"] == {"gpu": 1}
    monkeypatch.setenv("FOLDMILL_LOCAL_GPUS", "4")
    with open(REPO / "profiles/local/config.yaml") as stream:
        profile = yte.process_yaml(stream, require_use_yte=True)
    assert profile["resources"] == {"gpu": 4}
    assert "executor" not in profile and profile["keep-going"] is True
