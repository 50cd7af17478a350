"""The worklist: one validated row per target, written as TSV and Parquet.

Columns (also documented in config/README.md):
  target_id      safe file name, unique in the worklist
  content_hash   stable hash of what determines the prediction (see Target.content_hash)
  n_tokens       Boltz-2 tokens: one per standard residue, one per heavy atom of ligands and
                 modified residues
  n_chains       chains counting copies
  n_entities     distinct entities
  composition    e.g. "protein:2,ligand:1" (chains per entity type)
  chain_hashes   sequence hash per polymer chain, comma-separated (equal hash = same MSA)
  source         input file and record
  spec           canonical JSON of the Target (rebuild with Target.from_json)
Alongside, `unique_chains.tsv` lists each distinct polymer sequence once per MSA given with it
(none, `empty` or a file), with the number of chains that use it, so MSAs are staged once per
sequence and a user MSA serves only the chains that named it. `rejects.tsv` (REJECT_COLUMNS) has
one row per input record that was refused: target_id (empty when the record has none), source,
record, problem.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from foldmill.errors import FoldmillError, InputError
from foldmill.io.atomic import atomic_path
from foldmill.io.chemistry import ccd_heavy_atom_count, smiles_heavy_atom_count
from foldmill.io.readers import FASTA_SUFFIXES, SHEET_SUFFIXES, YAML_SUFFIXES, read_inputs
from foldmill.io.tables import read_table
from foldmill.io.targets import ENTITY_TYPES, Entity, Target, validate_target

log = logging.getLogger(__name__)

WORKLIST_COLUMNS = [
    "target_id",
    "content_hash",
    "n_tokens",
    "n_chains",
    "n_entities",
    "composition",
    "chain_hashes",
    "source",
    "spec",
]
REJECT_COLUMNS = ["target_id", "source", "record", "problem"]
INPUT_SUFFIXES = FASTA_SUFFIXES | SHEET_SUFFIXES | YAML_SUFFIXES


@dataclass
class WorklistResult:
    targets: list[Target]
    table: pd.DataFrame
    rejects: pd.DataFrame


def entity_tokens(entity: Entity, source: str, record: str) -> int:
    """Tokens of one copy of an entity, checking CCD codes and SMILES on the way."""
    if entity.entity_type == "ligand":
        if entity.ccd:
            count = ccd_heavy_atom_count(entity.ccd)
            if count is None:
                raise InputError(source, record, f"unknown CCD code {entity.ccd!r} for ligand {entity.chain_ids[0]}")
            return count
        try:
            return smiles_heavy_atom_count(entity.smiles or "")
        except ValueError as error:
            raise InputError(source, record, f"invalid SMILES for ligand {entity.chain_ids[0]}: {error}") from None
    tokens = len(entity.sequence or "")
    for mod in entity.modifications:
        count = ccd_heavy_atom_count(mod.ccd)
        if count is None:
            raise InputError(source, record, f"unknown CCD code {mod.ccd!r} for modification at position {mod.position}")
        tokens += count - 1
    return tokens


def target_tokens(target: Target) -> int:
    return sum(entity_tokens(e, target.source, target.record) * e.copies for e in target.entities)


def summarize(target: Target) -> dict[str, object]:
    """The worklist row of a validated target."""
    chains_per_type = Counter()
    for entity in target.entities:
        chains_per_type[entity.entity_type] += entity.copies
    composition = ",".join(f"{kind}:{chains_per_type[kind]}" for kind in ENTITY_TYPES if chains_per_type[kind])
    chain_hashes = ",".join(e.sequence_hash() for e in target.entities if e.is_polymer for _ in e.chain_ids)
    return {
        "target_id": target.target_id,
        "content_hash": target.content_hash(),
        "n_tokens": target_tokens(target),
        "n_chains": sum(e.copies for e in target.entities),
        "n_entities": len(target.entities),
        "composition": composition,
        "chain_hashes": chain_hashes,
        "source": f"{target.source}:{target.record}",
        "spec": target.to_json(),
    }


def expand_inputs(paths: Sequence[str | Path]) -> list[Path]:
    """Input files in order; a directory contributes its input files, sorted."""
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files.extend(sorted(p for p in path.iterdir() if p.suffix.lower() in INPUT_SUFFIXES))
        elif path.exists():
            files.append(path)
        else:
            raise FoldmillError(f"{path}: input does not exist")
    if not files:
        raise FoldmillError("no input files given")
    return files


def build_worklist(
    paths: Sequence[str | Path], skip_bad: bool = False, max_tokens: int | None = None
) -> WorklistResult:
    """Read, validate and summarize every target; duplicate ids are errors.

    With skip_bad=False the first bad record raises InputError; otherwise bad records are
    collected into the rejects table (target, source, problem) and the rest go on. A target of
    more than max_tokens tokens (the config's worklist.max_tokens) is a bad record too: it would
    not fit one GPU and only fail later, inside a fold job.
    """
    targets: list[Target] = []
    rows: list[dict[str, object]] = []
    rejects: list[dict[str, str]] = []
    seen: dict[str, str] = {}
    for path in expand_inputs(paths):
        for item in read_inputs(path):
            try:
                if isinstance(item, InputError):
                    raise item
                validate_target(item)
                if item.target_id in seen:
                    raise InputError(
                        item.source, item.record, f"duplicate target id {item.target_id!r} (first in {seen[item.target_id]})"
                    )
                row = summarize(item)
                if max_tokens is not None and row["n_tokens"] > max_tokens:
                    raise InputError(item.source, item.record, f"{row['n_tokens']} tokens > max_tokens {max_tokens}")
            except InputError as error:
                if not skip_bad:
                    raise
                target_id = item.target_id if isinstance(item, Target) else ""
                rejects.append(
                    {"target_id": target_id, "source": error.source, "record": error.record or "",
                     "problem": error.problem}
                )  # fmt: skip
                log.warning("rejected: %s", error)
                continue
            seen[item.target_id] = f"{item.source}:{item.record}"
            targets.append(item)
            rows.append(row)
    table = pd.DataFrame(rows, columns=WORKLIST_COLUMNS)
    return WorklistResult(targets, table, pd.DataFrame(rejects, columns=REJECT_COLUMNS))


def unique_chains(targets: Iterable[Target]) -> pd.DataFrame:
    """One row per distinct (polymer sequence, given MSA): hash, type, sequence, chains using it, MSA."""
    rows: dict[tuple[str, str], dict[str, object]] = {}
    for target in targets:
        for entity in target.entities:
            if not entity.is_polymer:
                continue
            key = (entity.sequence_hash(), entity.msa or "")
            row = rows.setdefault(
                key,
                {"chain_hash": key[0], "entity_type": entity.entity_type, "length": len(entity.sequence or ""),
                 "n_chains": 0, "msa": key[1], "sequence": entity.sequence},
            )
            row["n_chains"] = int(row["n_chains"]) + entity.copies
    return pd.DataFrame(list(rows.values()), columns=["chain_hash", "entity_type", "length", "n_chains", "msa", "sequence"])


def write_worklist(result: WorklistResult, outdir: str | Path, write_rejects: bool) -> None:
    """Write worklist.tsv, worklist.parquet, unique_chains.tsv (and rejects.tsv), each atomically."""
    outdir = Path(outdir)
    with atomic_path(outdir / "worklist.tsv") as tmp:
        result.table.to_csv(tmp, sep="\t", index=False)
    with atomic_path(outdir / "worklist.parquet") as tmp:
        result.table.to_parquet(tmp, index=False)
    with atomic_path(outdir / "unique_chains.tsv") as tmp:
        unique_chains(result.targets).to_csv(tmp, sep="\t", index=False)
    if write_rejects:
        with atomic_path(outdir / "rejects.tsv") as tmp:
            result.rejects.to_csv(tmp, sep="\t", index=False)


def read_worklist_table(path: str | Path, columns: Sequence[str] = ("spec",)) -> pd.DataFrame:
    """A worklist or shard table written by foldmill (TSV or Parquet), checked for `columns`."""
    path = Path(path)
    try:
        table = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False)
    except (OSError, ValueError) as error:
        raise FoldmillError(f"{path}: cannot read worklist: {error}") from None
    missing = [column for column in columns if column not in table.columns]
    if missing:
        raise FoldmillError(f"{path}: not a foldmill worklist or shard (no column {missing[0]!r})")
    return table


def load_worklist(path: str | Path) -> list[Target]:
    """Rebuild the Targets of a worklist written by `write_worklist` (TSV or Parquet)."""
    return [Target.from_json(spec) for spec in read_worklist_table(path)["spec"]]


def require_targets(worklist: str | Path, rejects: str | Path) -> int:
    """How many targets the worklist holds; a one-line FoldmillError when none is left to fold."""
    count = len(read_worklist_table(worklist, columns=("target_id",)))
    if count == 0:
        rejected = len(read_worklist_table(rejects, columns=())) if Path(rejects).exists() else 0
        raise FoldmillError(f"no target left to fold: {rejected} rejected, see {rejects}")
    return count


def read_rejects(path: str | Path) -> pd.DataFrame:
    """A worklist rejects table written by `write_worklist` (all columns as text)."""
    return read_table(path, REJECT_COLUMNS, "worklist rejects table")
