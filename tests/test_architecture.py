"""The import direction of ARCHITECTURE.md, checked by import-linter's contracts in pyproject.toml."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONTRACTS = (
    "Folding layers import only downwards",
    "The model and its kernels know nothing of the writers",
    "MoE pretraining shares only errors, io.atomic and the cluster layer with folding",
    "Folding does not import MoE pretraining",
)


def _lint_imports() -> str:
    found = Path(sys.executable).with_name("lint-imports")
    executable = str(found) if found.exists() else shutil.which("lint-imports")
    if executable is None:
        pytest.fail("lint-imports not installed: pip install import-linter (the test extra)")
    return executable


def test_import_contracts_hold():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [_lint_imports(), "--no-cache"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    report = result.stdout + result.stderr
    assert result.returncode == 0, report
    for name in CONTRACTS:
        assert f"{name} KEPT" in report.replace(f"{name}KEPT", f"{name} KEPT"), (name, report)
    assert "0 broken" in report, report


def test_kernels_import_without_the_model():
    """The kernel package loads and routes alone; the model registers its references when imported."""
    code = "import sys, foldmill.kernels; assert not any(m.startswith('foldmill.model') for m in sys.modules)"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=300)
