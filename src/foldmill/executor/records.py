"""Per-target records of a fold run: the journal written as targets finish, and the fold table.

The fold table (`OUTDIR/fold/<shard>.tsv`; read by foldmill.outputs.summary.read_fold_table) has one
row per target of the shard:
  target_id       as in the worklist
  status          ok | failed | rejected
  reason          why a target failed or was rejected (empty when ok)
  n_tokens        tokens of the target
  seconds         seconds the model replica spent on it (0 when it never reached one)
  replica         the replica that folded it, e.g. "gpu0@node" or "cpu0@node"
  prediction_dir  OUTDIR/predictions/<target_id> when ok, else empty
The journal (`<table>.journal.jsonl`, one JSON record per line, appended and flushed as each
target finishes) keeps the records of finished targets across interrupted runs, plus stage
timings (featurize, fold start/end, the model's own stages, write) that `foldmill bench throughput`
turns into a timeline.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TextIO

import pandas as pd

from foldmill.io.atomic import atomic_path
from foldmill.outputs.summary import FOLD_STATUSES, FOLD_TABLE_COLUMNS



@dataclass
class TargetRecord:
    target_id: str
    status: str  # ok | failed | rejected
    reason: str = ""
    n_tokens: int = 0
    seconds: float = 0.0
    replica: str = ""
    prediction_dir: str = ""
    # Timeline (journal only): stage seconds and the fold's wall-clock start/end (Unix time).
    featurize_seconds: float = 0.0
    write_seconds: float = 0.0
    fold_started: float = 0.0
    fold_finished: float = 0.0
    attempts: int = 1
    run: str = ""  # id of the run that produced the record
    model_stages: dict[str, float] = field(default_factory=dict)  # seconds per model stage (GPU fast path)

    def __post_init__(self) -> None:
        if self.status not in FOLD_STATUSES:
            raise ValueError(f"unknown status {self.status!r}")


def journal_path(table: Path) -> Path:
    return table.with_name(table.stem + ".journal.jsonl")


class Journal:
    """Append-only JSON-lines log of finished targets; a line cut short by a kill is ignored on read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._handle: TextIO | None = None

    def __enter__(self) -> Journal:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = self.path.open("a", encoding="utf-8")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._handle:
            self._handle.close()
            self._handle = None

    def append(self, record: TargetRecord) -> None:
        assert self._handle is not None, "Journal used outside its with-block"
        self._handle.write(json.dumps(asdict(record)) + "\n")
        self._handle.flush()

    @staticmethod
    def read(path: Path) -> dict[str, TargetRecord]:
        """Latest record per target id."""
        records: dict[str, TargetRecord] = {}
        if not path.exists():
            return records
        names = {f.name for f in fields(TargetRecord)}
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                data = json.loads(line)
                record = TargetRecord(**{k: v for k, v in data.items() if k in names})
            except (ValueError, TypeError):
                continue  # a line cut short by a kill
            records[record.target_id] = record
        return records


def records_table(records: list[TargetRecord]) -> pd.DataFrame:
    columns = list(FOLD_TABLE_COLUMNS)
    return pd.DataFrame([{c: getattr(r, c) for c in columns} for r in records], columns=columns)


def write_fold_table(records: list[TargetRecord], path: Path) -> None:
    with atomic_path(path) as tmp:
        records_table(records).to_csv(tmp, sep="\t", index=False, float_format="%.3f")

