"""The run summary: one row per worklist target with its status, composition and confidences.

Inputs are the per-shard fold tables (columns target_id, status ok|failed|rejected, reason,
n_tokens, seconds, replica, prediction_dir) and the worklist. For finished targets the metrics
come from the best model's confidence JSON and the target's prediction record. A relative
prediction_dir is read relative to the working directory (Snakemake's, like OUTDIR itself).

Metrics are rounded to 6 decimals: the engine computes them in float32 (about 7 significant
digits), and rounding makes the printed value the one the filters compare with thresholds.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from foldmill.errors import FoldmillError
from foldmill.io.atomic import owned_files
from foldmill.io.targets import Target
from foldmill.outputs.prediction import CONFIDENCE_SCALARS
from foldmill.outputs.writer import DONE_MARKER, record_name

log = logging.getLogger(__name__)

FOLD_TABLE_COLUMNS = ("target_id", "status", "reason", "n_tokens", "seconds", "replica", "prediction_dir")
FOLD_STATUSES = ("ok", "failed", "rejected")
METRIC_DECIMALS = 6
SUMMARY_COLUMNS = [
    "target_id",
    "status",  # ok | failed | rejected | missing (in the worklist, in no fold table)
    "status_reason",
    "target_type",  # monomer (one chain) | complex
    "n_chains",
    "n_residues",
    "n_tokens",
    "chain_lengths",  # "A:120,B:120,C:1" (residues; a ligand counts one)
    "composition",  # "protein:2,ligand:1"
    *CONFIDENCE_SCALARS,
    "chains_ptm",  # "A:0.81,B:0.77"
    "min_chain_ptm",  # lowest pTM of a polymer chain
    "min_pair_iptm",  # lowest / mean ipTM over ordered pairs of different chains
    "mean_pair_iptm",
    "interface_pae",  # mean PAE over inter-chain token contacts (< 8 A); empty without contacts
    "interface_contacts",
    "n_models",
    "best_model",
    "model",  # checkpoint sha256 or "demo"
    "seed",
    "seconds",
    "replica",
    "prediction_dir",
]
TEXT_COLUMNS = {
    "target_id", "status", "status_reason", "target_type", "chain_lengths", "composition", "chains_ptm",
    "best_model", "model", "seed", "replica", "prediction_dir",
}  # fmt: skip
COUNT_COLUMNS = {"n_chains", "n_residues", "n_tokens", "interface_contacts", "n_models"}
METRIC_COLUMNS = [*CONFIDENCE_SCALARS, "min_chain_ptm", "min_pair_iptm", "mean_pair_iptm", "interface_pae"]


def read_fold_table(path: str | Path) -> pd.DataFrame:
    """One shard's fold table, checked for the columns and statuses of the contract."""
    path = Path(path)
    try:
        table = pd.read_csv(
            path,
            sep="\t",
            dtype={"target_id": str, "reason": str, "prediction_dir": str, "replica": str},
            keep_default_na=False,
        )
    except (OSError, ValueError) as error:
        raise FoldmillError(f"{path}: cannot read fold table: {error}") from None
    missing = [column for column in FOLD_TABLE_COLUMNS if column not in table.columns]
    if missing:
        raise FoldmillError(f"{path}: fold table lacks column(s) {', '.join(missing)}")
    unknown = sorted(set(table["status"]) - set(FOLD_STATUSES))
    if unknown:
        raise FoldmillError(f"{path}: unknown status {unknown[0]!r} (expected {'|'.join(FOLD_STATUSES)})")
    return table[list(FOLD_TABLE_COLUMNS)]


def build_summary(fold_tables: Sequence[str | Path], worklist: str | Path) -> pd.DataFrame:
    """Summary rows in worklist order; targets in no fold table are reported as `missing`."""
    folds = pd.concat([read_fold_table(path) for path in fold_tables], ignore_index=True) if fold_tables else None
    fold_rows = {}
    if folds is not None:
        # A target folded twice (a retried shard) keeps its successful run.
        for row in folds.sort_values("status", key=lambda s: s == "ok", kind="stable").to_dict("records"):
            fold_rows[row["target_id"]] = row
    worklist_table = pd.read_csv(worklist, sep="\t", dtype=str, keep_default_na=False)
    rows = [_summary_row(item, fold_rows.get(item["target_id"])) for item in worklist_table.to_dict("records")]
    unknown = sorted(set(fold_rows) - set(worklist_table["target_id"]))
    if unknown:
        log.warning("%d folded target(s) not in the worklist, left out of the summary: %s", len(unknown), unknown[:5])
    return _typed(pd.DataFrame(rows, columns=SUMMARY_COLUMNS))


def _summary_row(worklist_row: dict[str, str], fold_row: dict | None) -> dict[str, object]:
    target = Target.from_json(worklist_row["spec"])
    lengths = {
        chain_id: (len(entity.sequence or "") if entity.is_polymer else 1)
        for entity in target.entities
        for chain_id in entity.chain_ids
    }
    row: dict[str, object] = {
        "target_id": target.target_id,
        "target_type": "monomer" if len(lengths) == 1 else "complex",
        "n_chains": len(lengths),
        "n_residues": sum(lengths.values()),
        "n_tokens": int(worklist_row["n_tokens"]),
        "chain_lengths": ",".join(f"{chain}:{length}" for chain, length in lengths.items()),
        "composition": worklist_row["composition"],
    }
    if fold_row is None:
        return {**row, "status": "missing", "status_reason": "not in any fold table"}
    row.update(
        status=fold_row["status"],
        status_reason=fold_row["reason"],
        seconds=float(fold_row["seconds"]) if str(fold_row["seconds"]) != "" else np.nan,
        replica=fold_row["replica"],
        prediction_dir=fold_row["prediction_dir"],
    )
    if fold_row["status"] == "ok":
        try:
            row.update(prediction_metrics(Path(fold_row["prediction_dir"]), target.target_id))
        except FoldmillError as error:
            row.update(status="failed", status_reason=str(error))
    return row


def prediction_metrics(directory: Path, target_id: str) -> dict[str, object]:
    """Summary metrics of a written prediction (its best model)."""
    record_path = directory / record_name(target_id)
    if not (directory / DONE_MARKER).exists() or not record_path.exists():
        raise FoldmillError(f"{directory}: prediction missing or incomplete (no '{DONE_MARKER}' marker)")
    record = json.loads(record_path.read_text(encoding="utf-8"))
    best = record["models"][0]
    confidence = json.loads((directory / best["files"]["confidence"]).read_text(encoding="utf-8"))
    chains = record["chains"]
    chain_ptm = {chain["chain_id"]: confidence["chains_ptm"][str(chain["index"])] for chain in chains}
    polymer_ptm = [chain_ptm[chain["chain_id"]] for chain in chains if chain["entity_type"] != "ligand"]
    pairs = [
        value
        for first, inner in confidence["pair_chains_iptm"].items()
        for second, value in inner.items()
        if first != second
    ]
    metrics: dict[str, object] = {key: _round(confidence[key]) for key in CONFIDENCE_SCALARS}
    metrics.update(
        chains_ptm=",".join(f"{chain}:{value:.4f}" for chain, value in chain_ptm.items()),
        min_chain_ptm=_round(min(polymer_ptm)) if polymer_ptm else np.nan,
        min_pair_iptm=_round(min(pairs)) if pairs else np.nan,
        mean_pair_iptm=_round(float(np.mean(pairs))) if pairs else np.nan,
        interface_pae=_round(best["interface_pae"]) if best["interface_pae"] is not None else np.nan,
        interface_contacts=int(best["interface_contacts"]),
        n_models=len(record["models"]),
        best_model=str(directory / best["files"]["structure"]),
        model=str(record["provenance"].get("model", "unknown")),
        seed=str(record["provenance"].get("seed", "")),
    )
    return metrics


def _round(value: float) -> float:
    return round(float(value), METRIC_DECIMALS)


def write_summary(table: pd.DataFrame, tsv: str | Path, parquet: str | Path, exclusive: bool = True) -> None:
    """Both files, replacing only an earlier summary's; exclusive: the directory holds nothing else."""
    with owned_files([tsv, parquet], "summary", exclusive) as (tsv_temporary, parquet_temporary):
        table.to_csv(tsv_temporary, sep="\t", index=False)
        table.to_parquet(parquet_temporary, index=False)


def read_summary(path: str | Path) -> pd.DataFrame:
    """A summary written by `write_summary` (TSV or Parquet): text columns as str, the rest numeric."""
    path = Path(path)
    try:
        if path.suffix == ".parquet":
            return pd.read_parquet(path)
        table = pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False)
    except (OSError, ValueError) as error:
        raise FoldmillError(f"{path}: cannot read summary: {error}") from None
    missing = [column for column in SUMMARY_COLUMNS if column not in table.columns]
    if missing:
        raise FoldmillError(f"{path}: not a foldmill summary (no column {missing[0]!r})")
    return _typed(table)


def _typed(table: pd.DataFrame) -> pd.DataFrame:
    """Text columns as str ("" when absent), counts as nullable integers, the rest float (NaN when absent)."""
    table = table.copy()
    for column in SUMMARY_COLUMNS:
        if column in TEXT_COLUMNS:
            table[column] = table[column].fillna("").astype(str)
        else:
            numbers = pd.to_numeric(table[column].replace("", np.nan)).astype(float)
            table[column] = numbers.astype("Int64") if column in COUNT_COLUMNS else numbers
    return table
