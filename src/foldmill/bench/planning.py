"""`foldmill bench planning`: how long Snakemake plans a run of many fold jobs with the Slurm profile.

For each shard count N in --shards: a synthetic proteome of N proteins is built into a worklist and
N shards by the workflow itself (`snakemake --cores C OUTDIR/shards`, not timed), then
`snakemake --profile profiles/slurm -n` is timed: Snakemake reads the shards, builds the DAG of N
fold jobs plus staging and outputs, evaluates every job's resources and prints the plan (to a file).
Both its wall time and its CPU time (user + system) are reported: on a shared machine the wall time
also counts waiting for a core, the CPU time does not.
With --with-groups the same dry run is timed again with a copy of the profile that groups the steps
after folding (summary ... report_figures) into one Slurm job, as the profile once did: a group
holding `summary`, which needs every fold job, makes Snakemake's group checks grow with N squared.
Writes OUT/planning.tsv and OUT/planning.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from foldmill.bench._out_dir import writes_only_its_own
from foldmill.bench._synthetic import random_protein
from foldmill.errors import FoldmillError
from foldmill.io.atomic import write_text_atomic

CHECKOUT = Path(__file__).resolve().parents[3]
GROUPS = """
groups:
  summary: outputs
  filter: outputs
  export: outputs
  export_archive: outputs
  report_figures: outputs
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "planning", help="seconds `snakemake -n` with the Slurm profile takes per shard count"
    )
    parser.add_argument("--shards", default="100,1000,10000", help="shard counts, comma-separated")
    parser.add_argument("--with-groups", action="store_true", help="also time the profile with the outputs grouped")
    parser.add_argument("--cores", type=int, default=2, help="cores for building the worklist and shards (untimed)")
    parser.add_argument("--work-dir", help="where the runs go (default: a temporary directory, removed)")
    parser.add_argument("--out", default="results/bench/planning")
    parser.set_defaults(handler=writes_only_its_own(run))


def _cpu_seconds_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _snakemake(workdir: Path, *args: str, profile: Path | None = None) -> tuple[float, float]:
    """Wall and CPU seconds one snakemake invocation took; its output goes to workdir/<first arg>.log."""
    command = [sys.executable, "-m", "snakemake", "-s", str(CHECKOUT / "Snakefile"), "--directory", str(workdir),
               "--configfile", str(workdir / "config.yaml"), *args]  # fmt: skip
    if profile is not None:
        command += ["--profile", str(profile)]
    # squeue: no accounting probe at profile load (the plan is what is timed)
    env = {**os.environ, "FOLDMILL_SLURM_STATUS_COMMAND": "squeue"}
    log = workdir / ("plan.log" if "-n" in args else "build.log")
    started, cpu_started = time.perf_counter(), _cpu_seconds_of_children()
    with open(log, "a") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    seconds, cpu_seconds = time.perf_counter() - started, _cpu_seconds_of_children() - cpu_started
    if done.returncode != 0:
        raise FoldmillError(f"planning bench: snakemake failed, see {log}")
    return seconds, cpu_seconds


def _prepare(workdir: Path, shards: int, cores: int) -> None:
    """A proteome of `shards` proteins of one length (so each is a shard of its own), built by the workflow."""
    rng = np.random.default_rng(0)
    fasta = "".join(f">SYN{index:06d}\n{random_protein(300, rng)}\n" for index in range(shards))
    (workdir / "proteome.fasta").write_text(fasta)
    (workdir / "config.yaml").write_text(
        "inputs: [proteome.fasta]\n"
        f"sharding: {{tokens_per_shard: 1, max_shards: {shards}}}\n"
        "model: {checkpoint: demo, device: cuda}\n"
        "moe: {enabled: false}\n"
        "slurm: {account: bench}\n"  # an account keeps the Slurm plugin from guessing one
    )
    _snakemake(workdir, "--cores", str(cores), "results/shards")
    built = len(list((workdir / "results/shards").glob("shard_*.tsv")))
    if built != shards:
        raise FoldmillError(f"planning bench: {built} shards built, {shards} wanted")


def run(args: argparse.Namespace) -> None:
    counts = [int(value) for value in args.shards.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(dir=args.work_dir) as scratch:
        for count in counts:
            workdir = Path(scratch) / f"shards_{count}"
            workdir.mkdir()
            _prepare(workdir, count, args.cores)
            seconds, cpu = _snakemake(workdir, "-n", profile=CHECKOUT / "profiles/slurm")
            grouped = None
            if args.with_groups:
                profile = workdir / "grouped-profile"
                profile.mkdir()
                profile_text = (CHECKOUT / "profiles/slurm/config.yaml").read_text()
                (profile / "config.yaml").write_text(profile_text + GROUPS)
                grouped = _snakemake(workdir, "-n", profile=profile)[0]
            rows.append((count, seconds, cpu, grouped))
            grouped_text = f" ({grouped:.1f} s grouped)" if grouped else ""
            print(f"{count} shards: {seconds:.1f} s, {cpu:.1f} s CPU{grouped_text}", flush=True)
    tsv = "shards\tseconds\tcpu_seconds\tseconds_grouped\n" + "".join(
        f"{count}\t{seconds:.2f}\t{cpu:.2f}\t{'' if grouped is None else f'{grouped:.2f}'}\n"
        for count, seconds, cpu, grouped in rows
    )
    write_text_atomic(out / "planning.tsv", tsv)
    table = [
        "| fold jobs (shards) | `snakemake -n`, profile | its CPU time | with the outputs grouped |",
        "| ---: | ---: | ---: | ---: |",
    ]
    table += [
        f"| {count:,} | {seconds:.1f} s | {cpu:.1f} s | {'-' if grouped is None else f'{grouped:.1f} s'} |"
        for count, seconds, cpu, grouped in rows
    ]
    machine = f"{platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    write_text_atomic(out / "planning.md", f"Planning time ({machine})\n\n" + "\n".join(table) + "\n")
    print("\n".join(table))
