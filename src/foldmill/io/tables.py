"""The TSV tables foldmill writes between rules (worklist rejects, staging manifests and rejects):
each module defines its columns once and reads its table back through `read_table`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from foldmill.errors import FoldmillError
from foldmill.io.atomic import atomic_path


def read_table(path: str | Path, columns: Sequence[str], what: str) -> pd.DataFrame:
    """`columns` of the TSV at `path`, all as text; a one-line error naming the file if it is not one."""
    try:
        table = pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False)
    except (OSError, ValueError) as error:
        raise FoldmillError(f"{path}: cannot read the {what}: {error}") from None
    missing = [column for column in columns if column not in table.columns]
    if missing:
        raise FoldmillError(f"{path}: not a foldmill {what} (no column {missing[0]!r})")
    return table[list(columns)]


def write_tables(tables: Mapping[str | Path | None, pd.DataFrame]) -> None:
    """Write each table as TSV atomically (a None path is skipped)."""
    for path, table in tables.items():
        if path is not None:
            with atomic_path(path) as tmp:
                table.to_csv(tmp, sep="\t", index=False)
