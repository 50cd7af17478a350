"""Measured crossover tables: the fastest backend per op, compute dtype and token count, per GPU architecture.

A table is `crossover_<arch>.json` (e.g. crossover_sm90.json) beside this module, or in the
directory named by FOLDMILL_CROSSOVER_DIR (a fresh measurement by `foldmill bench kernels`):

    {"arch": "sm_90", "device": "NVIDIA H200", "measured": "<date, software>",
     "ops": {op: {dtype: [{"max_tokens": 320, "order": ["reference", "cueq"]},
                          {"max_tokens": null, "order": ["cueq", "reference"]}]}},
     "timings_ms": {op: {dtype: {backend: {tokens: ms}}}}}

The first row whose max_tokens >= the call's token count (null: no bound) gives the backend
order. `table_from_timings` derives the rows from raw timings: at each measured size the
backends are ranked by time, and a switch between two neighbouring sizes is placed at their
geometric mean.
"""

from __future__ import annotations

import functools
import json
import math
import os
from pathlib import Path
from typing import Any

ENV_DIR = "FOLDMILL_CROSSOVER_DIR"
_PACKAGE_DIR = Path(__file__).parent


def table_path(arch: str) -> Path:
    directory = Path(os.environ.get(ENV_DIR) or _PACKAGE_DIR)
    return directory / f"crossover_{arch.replace('_', '')}.json"


@functools.cache
def _load(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def load_table(arch: str) -> dict[str, Any] | None:
    """The table for an architecture ("sm_90"), or None if none was measured."""
    path = table_path(arch)
    if not path.is_file() and os.environ.get(ENV_DIR):
        path = _PACKAGE_DIR / path.name  # the override directory lacks this arch: use the shipped one
    return _load(path)


def rows(arch: str, op: str, dtype: str) -> list[dict[str, Any]]:
    """The table's rows for an op and compute dtype ("bfloat16"); none when it does not cover them."""
    return (load_table(arch) or {}).get("ops", {}).get(op, {}).get(dtype) or []


def order(arch: str, op: str, dtype: str, num_tokens: int) -> list[str] | None:
    """Backend order for one call, or None when the table does not cover it."""
    op_rows = rows(arch, op, dtype)
    return lookup(op_rows, num_tokens) if op_rows else None


def lookup(rows: list[dict[str, Any]], num_tokens: int) -> list[str]:
    for row in rows:
        if row["max_tokens"] is None or num_tokens <= row["max_tokens"]:
            return list(row["order"])
    return list(rows[-1]["order"])


def table_from_timings(timings: dict[str, dict[str, float]]) -> list[dict[str, Any]]:
    """Rows for one op and dtype from {backend: {tokens: milliseconds}} (sizes as ints or strings).

    Adjacent sizes with the same ranking merge into one row; the last row has no bound.
    """
    sizes = sorted({int(size) for per_size in timings.values() for size in per_size})
    rankings = []
    for size in sizes:
        measured = {
            name: per_size[key]
            for name, per_size in timings.items()
            for key in per_size
            if int(key) == size and per_size[key] is not None
        }
        rankings.append(sorted(measured, key=measured.get))
    rows: list[dict[str, Any]] = []
    for index, ranking in enumerate(rankings):
        if rows and rows[-1]["order"] == ranking:
            rows[-1]["max_tokens"] = None
        else:
            rows.append({"max_tokens": None, "order": ranking})
        if index + 1 < len(sizes):
            # Provisional bound: the geometric mean with the next size (kept if the ranking changes there).
            rows[-1]["max_tokens"] = int(math.sqrt(sizes[index] * sizes[index + 1]))
    rows[-1]["max_tokens"] = None
    return rows
