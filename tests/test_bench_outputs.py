"""Benchmarks write their raw outputs to --out, whose default stays out of the repository's history."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import subprocess
from pathlib import Path

import pytest

import foldmill.bench

REPO = Path(__file__).resolve().parents[1]
BENCHES = sorted(m.name for m in pkgutil.iter_modules(foldmill.bench.__path__) if not m.name.startswith("_"))


def default_out(name: str) -> Path:
    module = importlib.import_module(f"foldmill.bench.{name}")
    parser = argparse.ArgumentParser()
    subparsers = parser.add_subparsers(dest="bench")
    module.register(subparsers)
    command = name.replace("_", "-")  # module moe_parity is `foldmill bench moe-parity`
    required = [a.option_strings[0] for a in subparsers.choices[command]._actions if a.required and a.option_strings]
    return Path(parser.parse_args([command, *(part for option in required for part in (option, "x"))]).out)


@pytest.mark.parametrize("name", BENCHES)
def test_default_out_is_a_git_ignored_folder_of_the_checkout(name: str) -> None:
    out = default_out(name)
    assert not out.is_absolute(), out
    ignored = subprocess.run(["git", "check-ignore", "-q", str(out / "forward_bench.json")], cwd=REPO, check=False)
    assert ignored.returncode == 0, f"foldmill bench {name} writes to {out}, which git would track"
