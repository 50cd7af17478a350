"""Streaming FASTA reader for corpora (plain or gzip; UniRef files and genomes do not fit in memory)."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from foldmill.errors import InputError


def _open(path: Path) -> TextIO:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def iter_fasta(path: str | Path) -> Iterator[tuple[str, str]]:
    """(record id = first word of the header, sequence) for each record of the file."""
    path = Path(path)
    record: str | None = None
    chunks: list[str] = []
    try:
        with _open(path) as handle:
            for number, raw in enumerate(handle, start=1):
                line = raw.strip()
                if not line:
                    continue
                if line.startswith(">"):
                    if record is not None:
                        yield record, "".join(chunks)
                    words = line[1:].split()
                    if not words:
                        raise InputError(str(path), f"line {number}", "FASTA header without a record id")
                    record, chunks = words[0], []
                elif record is None:
                    raise InputError(str(path), f"line {number}", "sequence before the first '>' header")
                else:
                    chunks.append(line)
    except (OSError, UnicodeDecodeError, EOFError) as error:
        raise InputError(str(path), None, f"cannot read FASTA: {error}") from None
    if record is not None:
        yield record, "".join(chunks)
