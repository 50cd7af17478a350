"""Confidence filters: thresholds per target type (monomer = one chain, complex = more), from config.

A target passes when it folded (status ok) and meets every threshold set for its type; a
threshold left empty (null) is not applied. Without a config the thresholds are the workflow's
defaults (`filters` in the config schema), so `foldmill filter` and the workflow agree.
Minimums are inclusive (value >= threshold), maximums too (value <= threshold). pLDDT thresholds
are on the 0-100 scale and compared with Boltz's complex_plddt (0-1) as complex_plddt >=
min_plddt / 100. A metric the target does not have (no interface contacts, no polymer chain)
fails a threshold set on it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pandas as pd

from foldmill.errors import FoldmillError
from foldmill.io.atomic import owned_files
from foldmill.outputs.summary import read_summary

TARGET_TYPES = ("monomer", "complex")
COMMAND = "filter"  # the owner named in the filter directory's ledger


@dataclass(frozen=True)
class Criterion:
    name: str  # the config key
    column: str  # the summary column compared
    label: str  # how reasons and plots name it
    minimum: bool  # True: value >= threshold passes; False: value <= threshold passes
    scale: float = 1.0  # threshold / scale is compared with the column


CRITERIA = (
    Criterion("min_plddt", "complex_plddt", "pLDDT", True, scale=100.0),
    Criterion("min_ptm", "ptm", "pTM", True),
    Criterion("min_iptm", "iptm", "ipTM", True),
    Criterion("min_chain_ptm", "min_chain_ptm", "per-chain pTM", True),
    Criterion("max_interface_pae", "interface_pae", "interface PAE", False),
)
STATUS_FILTER = "status"


@dataclass(frozen=True)
class Thresholds:
    min_plddt: float | None = None
    min_ptm: float | None = None
    min_iptm: float | None = None
    min_chain_ptm: float | None = None
    max_interface_pae: float | None = None


@dataclass(frozen=True)
class FilterConfig:
    monomer: Thresholds
    complex: Thresholds

    @classmethod
    def from_config(cls, section: Mapping[str, Any]) -> FilterConfig:
        """From the config's `filters:` section; unknown keys are errors (a typo must not pass silently)."""
        known = {f.name for f in fields(Thresholds)}
        values = {}
        for target_type in TARGET_TYPES:
            given = dict(section.get(target_type) or {})
            unknown = sorted(set(given) - known)
            if unknown:
                raise FoldmillError(
                    f"filters.{target_type}: unknown threshold {unknown[0]!r} (known: {', '.join(sorted(known))})"
                )
            values[target_type] = Thresholds(**{k: (None if v is None else float(v)) for k, v in given.items()})
        return cls(**values)

    def for_type(self, target_type: str) -> Thresholds:
        return getattr(self, target_type)


def apply_filters(summary: pd.DataFrame, config: FilterConfig) -> pd.DataFrame:
    """The summary with `passed` (bool), `failed_filters` (comma-separated) and `reason` added."""
    decisions = [_decide(row, config) for row in summary.to_dict("records")]
    result = summary.copy()
    result["passed"] = [not failed for failed, _ in decisions]
    result["failed_filters"] = [",".join(failed) for failed, _ in decisions]
    result["reason"] = [reason for _, reason in decisions]
    return result


def _decide(row: Mapping[str, Any], config: FilterConfig) -> tuple[list[str], str]:
    if row["status"] != "ok":  # a target refused before folding may have no type
        detail = f": {row['status_reason']}" if row.get("status_reason") else ""
        return [STATUS_FILTER], f"status {row['status']}{detail}"
    thresholds = config.for_type(row["target_type"])
    failed, reasons = [], []
    for criterion in CRITERIA:
        threshold = getattr(thresholds, criterion.name)
        if threshold is None:
            continue
        value = row[criterion.column]
        shown = _format(value * criterion.scale) if _present(value) else "n/a"
        if not _present(value):
            reasons.append(f"{criterion.label} not available ({criterion.name} {_format(threshold)})")
        elif criterion.minimum and value < threshold / criterion.scale:
            reasons.append(f"{criterion.label} {shown} < {_format(threshold)}")
        elif not criterion.minimum and value > threshold / criterion.scale:
            reasons.append(f"{criterion.label} {shown} > {_format(threshold)}")
        else:
            continue
        failed.append(criterion.name)
    return failed, "; ".join(reasons)


def _present(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _format(value: float) -> str:
    return f"{value:.6g}"


def write_filter_tables(result: pd.DataFrame, passed: str | Path, failed: str | Path) -> None:
    """Both tables, into a directory that is new, empty or holds only an earlier filter's tables."""
    with owned_files([passed, failed], COMMAND) as (passed_temporary, failed_temporary):
        result[result["passed"]].to_csv(passed_temporary, sep="\t", index=False)
        result[~result["passed"]].to_csv(failed_temporary, sep="\t", index=False)


def failure_counts(result: pd.DataFrame) -> dict[str, int]:
    """Targets failing each filter (a target can fail several), `status` first, in criteria order."""
    counts = {STATUS_FILTER: 0, **{criterion.name: 0 for criterion in CRITERIA}}
    for failed in result["failed_filters"]:
        for name in filter(None, str(failed).split(",")):
            counts[name] += 1
    return counts


def read_filter_result(passed: str | Path, failed: str | Path) -> pd.DataFrame:
    """Both filter tables back as one frame (summary columns typed, `passed` as bool)."""
    result = pd.concat([read_summary(passed), read_summary(failed)], ignore_index=True)
    result["passed"] = result["passed"].astype(str) == "True"
    result["failed_filters"] = result["failed_filters"].astype(str)
    result["reason"] = result["reason"].astype(str)
    return result
