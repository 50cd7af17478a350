"""Read per-chain MSAs (A3M, Boltz CSV, Stockholm) into `MSA` arrays.

All three formats are first brought to A3M row convention: upper-case letters and '-' are the
query's columns, lower-case letters are insertions relative to the query (they become the
deletion counts of the next query column; insertions after the last column have no column and
are dropped). Rows repeating an earlier sequence are dropped as in Boltz (in Boltz CSVs, keyed
repeats stay: their key pairs them) and the MSA is capped at `max_depth` rows keeping file
order, which is the search's ranking.

Formats:
  .a3m / .a3m.gz  '>' headers; sequences may wrap; '#' and ';' lines are comments; '.' (A2M
                  gaps in insert columns) is ignored. The pairing key comes from the header
                  (`foldmill.msa.keys.pairing_key`).
  .csv            Boltz's `key,sequence` table; rows with equal non-empty keys pair across chains.
  .sto / .stockholm  the first sequence is the query; columns where it has a gap are insertions.
                  Keys come from `#=GS <name> DE` descriptions, else the name.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from foldmill.errors import InputError
from foldmill.msa.keys import pairing_key
from foldmill.msa.types import MSA

DEFAULT_MAX_DEPTH = 8192

A3M_SUFFIXES = (".a3m", ".a3m.gz")
CSV_SUFFIXES = (".csv",)
UNPAIRED_CSV_KEY = "-1"
STOCKHOLM_SUFFIXES = (".sto", ".stockholm", ".sto.gz", ".stockholm.gz")

_GAP = ord("-")
_DOT = ord(".")


@dataclass(frozen=True)
class RawRow:
    """One alignment row in A3M convention, before decoding."""

    text: str
    key: str
    record: str  # where it came from, for error messages ("line 12", "row 3")


def _open_text(path: Path):
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8", errors="replace")
    return open(path, encoding="utf-8", errors="replace")


def msa_format(path: str | Path) -> str:
    """'a3m', 'csv' or 'stockholm' from the file name; InputError for anything else."""
    name = Path(path).name.lower()
    for suffixes, kind in ((A3M_SUFFIXES, "a3m"), (CSV_SUFFIXES, "csv"), (STOCKHOLM_SUFFIXES, "stockholm")):
        if name.endswith(suffixes):
            return kind
    raise InputError(str(path), None, "unknown MSA format (expected .a3m, .a3m.gz, .csv, .sto or .stockholm)")


def a3m_rows(path: Path) -> Iterator[RawRow]:
    with _open_text(path) as handle:
        yield from a3m_text_rows(handle, str(path))


def a3m_text_rows(lines: Iterable[str], source: str) -> Iterator[RawRow]:
    """Rows of A3M text (a file's lines, or a search's output); `source` names it in errors."""
    header: str | None = None
    start = 0
    parts: list[str] = []
    for number, line in enumerate(lines, start=1):
        line = line.replace("\x00", "").strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith(">"):
            if header is not None:
                yield RawRow("".join(parts), pairing_key(header), f"line {start}")
            header, start, parts = line[1:], number, []
        elif header is None:
            raise InputError(source, f"line {number}", "sequence before the first '>' header (not an A3M file?)")
        else:
            parts.append(line)
    if header is not None:
        yield RawRow("".join(parts), pairing_key(header), f"line {start}")


def csv_rows(path: Path) -> Iterator[RawRow]:
    with _open_text(path) as handle:
        reader = csv.DictReader(handle)
        columns = sorted(reader.fieldnames or [])
        if columns != ["key", "sequence"]:
            raise InputError(
                str(path), "header", f"expected the columns key,sequence, found {','.join(columns) or 'none'}"
            )
        for number, row in enumerate(reader, start=2):
            text = (row["sequence"] or "").strip()
            key = (row["key"] or "").strip()
            if text:
                # Boltz CSVs (and ColabFold's server output) mark unpaired rows with key -1.
                yield RawRow(text, "" if key == UNPAIRED_CSV_KEY else key, f"line {number}")


def stockholm_rows(path: Path) -> Iterator[RawRow]:
    """Stockholm rows converted to A3M convention against the first sequence (the query)."""
    sequences: dict[str, list[str]] = {}
    descriptions: dict[str, str] = {}
    first_line: dict[str, int] = {}
    with _open_text(path) as handle:
        for number, line in enumerate(handle, start=1):
            line = line.strip()
            if line == "//":
                break
            if line.startswith("#=GS"):
                fields = line.split(maxsplit=3)
                if len(fields) == 4 and fields[2] == "DE":
                    descriptions[fields[1]] = fields[3]
                continue
            if not line or line.startswith("#"):
                continue
            fields = line.split()
            if len(fields) != 2:
                raise InputError(str(path), f"line {number}", "expected '<name> <aligned sequence>'")
            sequences.setdefault(fields[0], []).append(fields[1])
            first_line.setdefault(fields[0], number)
    if not sequences:
        return
    aligned = {name: "".join(parts) for name, parts in sequences.items()}
    query = np.frombuffer(next(iter(aligned.values())).encode("ascii", "replace"), dtype=np.uint8)
    query_columns = (query != _GAP) & (query != _DOT)
    for name, text in aligned.items():
        row = np.frombuffer(text.encode("ascii", "replace"), dtype=np.uint8)
        if row.shape != query.shape:
            raise InputError(
                str(path), f"line {first_line[name]}", f"sequence {name} has {len(row)} columns, the query {len(query)}"
            )
        is_gap = (row == _GAP) | (row == _DOT)
        converted = np.where(query_columns, np.where(is_gap, _GAP, _upper(row)), _lower(row))
        keep = query_columns | ~is_gap
        key = pairing_key(f"{name} {descriptions.get(name, '')}")
        yield RawRow(converted[keep].tobytes().decode("ascii"), key, f"line {first_line[name]}")


def _upper(codes: np.ndarray) -> np.ndarray:
    return np.where((codes >= 97) & (codes <= 122), codes - 32, codes)


def _lower(codes: np.ndarray) -> np.ndarray:
    return np.where((codes >= 65) & (codes <= 90), codes + 32, codes)


def decode_row(row: RawRow, source: str) -> tuple[np.ndarray, np.ndarray]:
    """Aligned residues (upper-case ASCII, '-' gaps) and per-column insertion counts of one row."""
    codes = np.frombuffer(row.text.rstrip("*").encode("ascii", "replace"), dtype=np.uint8)
    is_lower = (codes >= 97) & (codes <= 122)
    is_upper = (codes >= 65) & (codes <= 90)
    bad = ~(is_lower | is_upper | (codes == _GAP) | (codes == _DOT))
    if bad.any():
        position = int(np.argmax(bad))
        raise InputError(source, row.record, f"invalid character {row.text[position]!r} at column {position + 1}")
    is_column = is_upper | (codes == _GAP)
    inserted_so_far = np.cumsum(is_lower, dtype=np.int32)[is_column]
    deletions = np.diff(inserted_so_far, prepend=np.int32(0)).astype(np.int32)
    return codes[is_column].copy(), deletions


def rows_to_msa(
    rows: Iterator[RawRow], source: str, max_depth: int = DEFAULT_MAX_DEPTH, keep_keyed_duplicates: bool = False
) -> MSA:
    """Decode rows into an MSA: row 0 is the first row, at most max_depth rows.

    A row repeating an earlier row's sequence (insertions included, gaps ignored) is dropped,
    as Boltz does. With keep_keyed_duplicates (Boltz CSV semantics, as Boltz's parse_csv) repeats
    that carry a pairing key stay, since their key says which rows of other chains they pair
    with, and the query row keeps its key too (Boltz's paired CSVs key it 0); otherwise the query
    row has no key (it pairs with every chain's query row anyway).
    """
    residues: list[np.ndarray] = []
    deletions: list[np.ndarray] = []
    keys: list[str] = []
    fingerprints: list[int] = []
    seen: set[str] = set()
    length = None
    for row in rows:
        row_residues, row_deletions = decode_row(row, source)
        if length is None:
            length = len(row_residues)
            if length == 0:
                raise InputError(source, row.record, "the query row is empty")
            key = row.key if keep_keyed_duplicates else ""
        elif len(row_residues) != length:
            raise InputError(
                source, row.record, f"row has {len(row_residues)} aligned columns but the query has {length}"
            )
        else:
            key = row.key
        sequence = row.text.replace("-", "").replace(".", "").upper()
        if sequence in seen and not (keep_keyed_duplicates and key):
            continue
        seen.add(sequence)
        residues.append(row_residues)
        deletions.append(row_deletions)
        keys.append(key)
        fingerprints.append(row_fingerprint(sequence))
        if len(residues) >= max_depth:
            break
    if not residues:
        raise InputError(source, None, "the MSA has no sequences")
    return MSA(np.stack(residues), np.stack(deletions), np.array(keys, dtype=str), np.array(fingerprints, np.uint64))


def row_fingerprint(sequence: str) -> int:
    """64-bit digest of a row's duplicate-check text (see rows_to_msa)."""
    return int.from_bytes(hashlib.blake2b(sequence.encode("ascii", "replace"), digest_size=8).digest(), "little")


def drop_duplicate_rows(msa: MSA) -> MSA:
    """The MSA without rows repeating an earlier row (residues, insertion counts and key)."""
    seen: set[tuple[bytes, bytes, str]] = set()
    keep = []
    for index in range(msa.depth):
        identity = (msa.residues[index].tobytes(), msa.deletions[index].tobytes(), str(msa.keys[index]))
        if identity not in seen:
            seen.add(identity)
            keep.append(index)
    return msa.select_rows(np.array(keep, dtype=np.int64))


def fit_to_sequence(msa: MSA, sequence: str, source: str) -> MSA:
    """Check that the MSA's query is `sequence` and return the MSA over exactly its columns.

    'X' on either side matches anything (unknown residues). A query that contains the sequence
    (an MSA of the full protein used for a construct) is cropped to the sequence's columns,
    dropping rows left all gaps or duplicated by the crop.
    Row 0 becomes the chain sequence itself. Raises InputError naming the file otherwise.
    """
    sequence = sequence.upper()
    target = np.frombuffer(sequence.encode("ascii"), dtype=np.uint8)
    query = msa.residues[0]
    offset = _find_window(query, target)
    if offset is None:
        raise InputError(source, "row 1 (query)", _mismatch(msa.query, sequence))
    if offset or len(query) != len(target):
        msa = msa.crop_columns(offset, offset + len(target))
        informative = (msa.residues != _GAP).any(axis=1)
        informative[0] = True
        msa = drop_duplicate_rows(msa.select_rows(np.flatnonzero(informative)))
    residues = msa.residues.copy()
    residues[0] = target
    return MSA(residues, msa.deletions, msa.keys, msa.fingerprints)


def _find_window(query: np.ndarray, target: np.ndarray) -> int | None:
    """First offset where `target` matches `query[offset:offset+len(target)]` ('X' = wildcard)."""
    if len(target) > len(query):
        return None
    windows = np.lib.stride_tricks.sliding_window_view(query, len(target))
    wildcard = (windows == ord("X")) | (target == ord("X"))[None, :]
    matches = ((windows == target[None, :]) | wildcard).all(axis=1)
    hits = np.flatnonzero(matches)
    return int(hits[0]) if len(hits) else None


def _mismatch(query: str, sequence: str) -> str:
    if len(query) != len(sequence):
        return (
            f"the MSA query ({len(query)} residues, starts {query[:12]!r}) is not the chain sequence "
            f"({len(sequence)} residues, starts {sequence[:12]!r}) nor contains it"
        )
    position = next(i for i, (a, b) in enumerate(zip(query, sequence)) if a != b and "X" not in (a, b))
    return (
        f"the MSA query does not match the chain sequence: residue {position + 1} is "
        f"{query[position]!r} in the MSA but {sequence[position]!r} in the chain"
    )


def read_msa(path: str | Path, sequence: str | None = None, max_depth: int = DEFAULT_MAX_DEPTH) -> MSA:
    """Read an A3M, Boltz CSV or Stockholm MSA; with `sequence`, check and fit its query to it."""
    path = Path(path)
    kind = msa_format(path)
    try:
        rows = {"a3m": a3m_rows, "csv": csv_rows, "stockholm": stockholm_rows}[kind](path)
        msa = rows_to_msa(rows, str(path), max_depth, keep_keyed_duplicates=kind == "csv")
    except (OSError, UnicodeError, csv.Error) as error:
        raise InputError(str(path), None, f"cannot read MSA: {error}") from None
    return fit_to_sequence(msa, sequence, str(path)) if sequence is not None else msa
