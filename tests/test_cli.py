"""The foldmill command itself."""

from __future__ import annotations

import subprocess
import sys


def run_foldmill(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "foldmill", *args], capture_output=True, text=True)


def test_doctor_reports_the_environment() -> None:
    done = run_foldmill("doctor")
    assert done.returncode == 0, done.stderr
    found = dict(line.split(None, 1) for line in done.stdout.strip().splitlines())
    import ray
    import torch

    assert found["torch"] == torch.__version__
    assert found["ray"] == ray.__version__
    assert "cuda" in done.stdout and "slurm" in found and "mmseqs" in found


def test_every_subcommand_has_help() -> None:
    import argparse

    from foldmill.cli import build_parser

    actions = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    listed = list(actions[0].choices)
    assert {"worklist", "doctor", "bench"} <= set(listed)
    for command in listed:
        assert run_foldmill(command, "--help").returncode == 0, command


def test_missing_input_is_one_line() -> None:
    done = run_foldmill("worklist", "/nonexistent/input.fasta", "-o", "/tmp/unused")
    assert done.returncode == 2
    assert done.stderr == "foldmill: error: /nonexistent/input.fasta: input does not exist\n"
