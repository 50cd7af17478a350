"""The run summary: one row per target the user gave, with its status, composition, MSAs and confidences.

Inputs are the per-shard fold tables (columns target_id, status ok|failed|rejected|skipped, reason,
n_tokens, seconds, replica, prediction_dir), the worklist and, from a workflow run, what was refused
on the way (RunRecords): the worklist's rejects (rows after the worklist's, status rejected), the
MSA staging manifest (per-chain MSA depth and source) and rejects (status rejected, whatever the
fold said), the template rejects (status unchanged, a note in `warnings`) and the per-shard job
tables of the fold jobs (OUTDIR/logs/fold/<shard>.jobs.tsv: the shard, Slurm job id and node that
folded each target; foldmill.runtime.job_log). For finished targets
the metrics come from the best model's confidence JSON and the target's prediction record. A
relative prediction_dir is read relative to the working directory (Snakemake's, like OUTDIR itself).

Metrics are rounded to 6 decimals: the engine computes them in float32 (about 7 significant
digits), and rounding makes the printed value the one the filters compare with thresholds.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from foldmill.errors import FoldmillError
from foldmill.io.atomic import owned_files
from foldmill.io.targets import Target
from foldmill.io.worklist import read_rejects
from foldmill.msa.staging import read_msa_manifest, read_msa_rejects, staged_keys
from foldmill.outputs.prediction import CONFIDENCE_SCALARS
from foldmill.outputs.writer import DONE_MARKER, record_name
from foldmill.provenance import DEMO_WARNING, is_demo_checkpoint
from foldmill.templates.staging import read_template_rejects

log = logging.getLogger(__name__)

FOLD_TABLE_COLUMNS = ("target_id", "status", "reason", "n_tokens", "seconds", "replica", "prediction_dir")
FOLD_STATUSES = ("ok", "failed", "rejected", "skipped")
METRIC_DECIMALS = 6
SUMMARY_COLUMNS = [
    "target_id",
    "status",  # ok | failed | rejected | skipped | missing (in the worklist, in no fold table)
    "status_reason",
    "warnings",  # "; "-separated notes on a target that folded: demo model, templates left out
    "target_type",  # monomer (one chain) | complex
    "n_chains",
    "n_residues",
    "n_tokens",
    "chain_lengths",  # "A:120,B:120,C:1" (residues; a ligand counts one)
    "composition",  # "protein:2,ligand:1"
    "msa_depth",  # rows of each protein chain's staged MSA, query included: "A:3712,B:1" (0 = none staged)
    "msa_source",  # "A:user,B:search" (user | search | server | single_sequence | fallback | rejected | none)
    "msa_protocol",  # "A:colabfold+paired,B:colabfold+paired" (colabfold | simple, +paired: paired rows lead it)
    "min_msa_depth",  # lowest depth over the protein chains (1 = a chain folded from its sequence alone)
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
    "shard",  # the fold job that folded the target: its shard, Slurm job id ("" outside Slurm) and node
    "job_id",
    "node",
    "prediction_dir",
    "source",  # input file:record the target came from
]
TEXT_COLUMNS = {
    "target_id", "status", "status_reason", "warnings", "target_type", "chain_lengths", "composition",
    "msa_depth", "msa_source", "msa_protocol", "chains_ptm", "best_model", "model", "seed", "replica", "shard",
    "job_id", "node", "prediction_dir", "source",
}  # fmt: skip
COUNT_COLUMNS = {"n_chains", "n_residues", "n_tokens", "min_msa_depth", "interface_contacts", "n_models"}
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


_STAGED_FILES = ("msa_manifest.tsv", "msa_rejects.tsv", "templates_rejects.tsv")


@dataclass(frozen=True)
class RunRecords:
    """What a workflow run refused or staged on the way to folding (each optional: None = not known)."""

    worklist_rejects: str | Path | None = None  # OUTDIR/worklist/rejects.tsv
    msa_manifest: str | Path | None = None  # OUTDIR/staged/msa_manifest.tsv
    msa_rejects: str | Path | None = None  # OUTDIR/staged/msa_rejects.tsv
    template_rejects: str | Path | None = None  # OUTDIR/staged/templates_rejects.tsv
    job_tables: Sequence[str | Path] = ()  # OUTDIR/logs/fold/<shard>.jobs.tsv

    @classmethod
    def beside(cls, worklist: str | Path) -> RunRecords:
        """The records of the run whose worklist is `worklist` (OUTDIR/worklist/worklist.tsv), those present."""
        folder = Path(worklist).parent
        paths = (folder / "rejects.tsv", *(folder.parent / "staged" / name for name in _STAGED_FILES))
        job_tables = tuple(sorted((folder.parent / "logs" / "fold").glob("shard_*.jobs.tsv")))
        return cls(*(path if path.is_file() else None for path in paths), job_tables=job_tables)


@dataclass
class _Staged:
    """RunRecords read: MSA depth/source and rejects by msa_key, template notes by target."""

    # None: no manifest, no MSA columns; (msa_key, complex) -> depth, source, protocol, paired rows, note
    msas: dict[tuple[str, str, str], tuple[int, str, str, int, str]] | None
    msa_rejects: dict[tuple[str, str, str], str]
    template_notes: dict[str, list[str]]
    jobs: dict[str, dict[str, str]]  # target_id -> shard, job_id, node

    @classmethod
    def read(cls, records: RunRecords) -> _Staged:
        msas = None
        if records.msa_manifest is not None:
            table = read_msa_manifest(records.msa_manifest)
            keys = zip(table["chain_hash"], table["given_msa"], table["complex"])
            values = zip(table["depth"], table["source"], table["protocol"], table["paired_rows"], table["note"])
            msas = dict(zip(keys, values))
        msa_rejects = {}
        if records.msa_rejects is not None:
            table = read_msa_rejects(records.msa_rejects)
            for row in table.itertuples(index=False):
                msa_rejects[(row.chain_hash, row.given_msa, row.complex)] = f"{row.source}: {row.problem}"
        notes: dict[str, list[str]] = {}
        if records.template_rejects is not None:
            for row in read_template_rejects(records.template_rejects).itertuples(index=False):
                notes.setdefault(row.target_id, []).append(f"templates not used: {row.problem}")
        jobs = {}
        for path in records.job_tables:
            table = pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False)
            for row in table.to_dict("records"):
                jobs[row["target_id"]] = {key: row.get(key, "") for key in ("shard", "job_id", "node")}
        return cls(msas, msa_rejects, notes, jobs)


def build_summary(
    fold_tables: Sequence[str | Path], worklist: str | Path, records: RunRecords | None = None
) -> pd.DataFrame:
    """Summary rows in worklist order, then the worklist's rejects; targets in no fold table are `missing`."""
    records = records or RunRecords()
    folds = pd.concat([read_fold_table(path) for path in fold_tables], ignore_index=True) if fold_tables else None
    fold_rows = {}
    if folds is not None:
        # A target folded twice (a retried shard) keeps its successful run.
        for row in folds.sort_values("status", key=lambda s: s == "ok", kind="stable").to_dict("records"):
            fold_rows[row["target_id"]] = row
    worklist_table = pd.read_csv(worklist, sep="\t", dtype=str, keep_default_na=False)
    staged = _Staged.read(records)
    rows = [_summary_row(item, fold_rows.get(item["target_id"]), staged) for item in worklist_table.to_dict("records")]
    if records.worklist_rejects is not None:
        rows += [_rejected_row(item) for item in read_rejects(records.worklist_rejects).to_dict("records")]
    unknown = sorted(set(fold_rows) - set(worklist_table["target_id"]))
    if unknown:
        log.warning("%d folded target(s) not in the worklist, left out of the summary: %s", len(unknown), unknown[:5])
    return _typed(pd.DataFrame(rows, columns=SUMMARY_COLUMNS))


def summary_notes(table: pd.DataFrame) -> tuple[str, list[str]]:
    """The run summary for the console: a line of counts by status, and the warnings a user must see."""
    counts = table["status"].value_counts().to_dict()
    line = f"{len(table)} targets ({', '.join(f'{n} {s}' for s, n in sorted(counts.items())) or 'none'})"
    warnings = []
    demo = int(table["model"].map(is_demo_checkpoint).sum())
    if demo:
        warnings.append(f"{demo} target(s) folded by the {DEMO_WARNING}")
    fallen = int(table["warnings"].str.contains("MSA fallback", regex=False).sum())
    if fallen:
        warnings.append(f"{fallen} target(s) folded with fallback MSAs (msa.on_failure; see the warnings column)")
    templates = int(table["warnings"].str.contains("templates not used", regex=False).sum())
    if templates:
        warnings.append(f"{templates} target(s) folded without some of their templates (see the warnings column)")
    return line, warnings


def _rejected_row(reject: dict[str, str]) -> dict[str, object]:
    """The summary row of an input record the worklist refused."""
    where = f"{reject['source']}:{reject['record']}" if reject["record"] else reject["source"]
    return {
        "target_id": reject["target_id"],
        "status": "rejected",
        "status_reason": f"input rejected: {reject['problem']}",
        "source": where,
    }


def _summary_row(worklist_row: dict[str, str], fold_row: dict | None, staged: _Staged) -> dict[str, object]:
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
        "source": worklist_row["source"],
        **_msa_columns(target, staged),
    }
    msa_problems = []
    for entity in target.entities:
        outcome, problem = _chain_msa(target, entity, staged) if entity.entity_type == "protein" else ("", None)
        if outcome == "rejected":
            msa_problems.append(f"MSA of chain {entity.chain_ids[0]} rejected: {problem}")
    if fold_row is None:
        row.update(status="missing", status_reason="not in any fold table")
    else:
        row.update(
            status=fold_row["status"],
            status_reason=fold_row["reason"],
            seconds=float(fold_row["seconds"]) if str(fold_row["seconds"]) != "" else np.nan,
            replica=fold_row["replica"],
            prediction_dir=fold_row["prediction_dir"],
            **staged.jobs.get(target.target_id, {}),
        )
    if msa_problems and row["status"] != "ok":
        row.update(status="rejected", status_reason="; ".join(msa_problems))
    if row["status"] == "ok":
        try:
            row.update(prediction_metrics(Path(fold_row["prediction_dir"]), target.target_id))
        except FoldmillError as error:
            row.update(status="failed", status_reason=str(error))
    warnings = _fallback_notes(target, staged) + staged.template_notes.get(target.target_id, [])
    if row["status"] == "ok" and is_demo_checkpoint(row.get("model", "")):
        warnings.insert(0, DEMO_WARNING)
    row["warnings"] = "; ".join(warnings)
    return row


def _chain_msa(target: Target, entity, staged: _Staged) -> tuple[str, object]:
    """A protein entity's staging outcome, looked up as the featurizer does (the target's complex
    row first, then the chain's own): ("rejected", problem), ("staged", (depth, source, protocol,
    paired rows, note)) or ("none", None)."""
    for lookup in staged_keys(target, entity):
        if lookup in staged.msa_rejects:
            return "rejected", staged.msa_rejects[lookup]
        if staged.msas is not None and lookup in staged.msas:
            return "staged", staged.msas[lookup]
    return "none", None


def _msa_columns(target: Target, staged: _Staged) -> dict[str, object]:
    """msa_depth, msa_source, msa_protocol and min_msa_depth of the target's protein chains (empty
    without a manifest)."""
    if staged.msas is None:
        return {}
    depths, sources, protocols = {}, {}, {}
    for entity in target.entities:
        if entity.entity_type != "protein":
            continue
        outcome, found = _chain_msa(target, entity, staged)
        depth, source, protocol, paired, _ = found if outcome == "staged" else (0, outcome, "", 0, "")
        for chain_id in entity.chain_ids:
            depths[chain_id], sources[chain_id] = int(depth), source
            protocols[chain_id] = protocol + ("+paired" if int(paired) else "")
    return {
        "msa_depth": ",".join(f"{chain}:{depth}" for chain, depth in depths.items()),
        "msa_source": ",".join(f"{chain}:{source}" for chain, source in sources.items()),
        "msa_protocol": ",".join(f"{chain}:{protocol}" for chain, protocol in protocols.items() if protocol),
        "min_msa_depth": min(depths.values()) if depths else np.nan,
    }


def _fallback_notes(target: Target, staged: _Staged) -> list[str]:
    """A note per protein chain whose MSA fell back (msa.on_failure: fallback), with the reason."""
    if staged.msas is None:
        return []
    notes = []
    for entity in target.entities:
        outcome, found = _chain_msa(target, entity, staged) if entity.entity_type == "protein" else ("", None)
        if outcome == "staged" and found[1] == "fallback":
            what = "unpaired MSA" if found[4].startswith("unpaired only") else "single-sequence MSA"
            notes.append(f"chain {entity.chain_ids[0]}: {what} fallback ({found[4]})")
    return notes


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
