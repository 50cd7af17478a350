"""Stage one MSA per distinct polymer chain of a worklist (rule `stage_msas`).

Input: the worklist's `unique_chains.tsv` (one row per sequence hash). Output:
  msa_manifest.tsv  chain_hash, entity_type, path, depth, source
                    path = absolute path of an `MSA.save` .npz; source = user | search | single_sequence
  msa_rejects.tsv   chain_hash, target_ids, source, problem   (chains whose MSA could not be staged;
                    the targets using them must be skipped downstream)

Which MSA a chain gets:
  * the chain names an MSA file (A3M / CSV / Stockholm)   -> that file, checked against the sequence (user)
  * the chain says `msa: empty`, or is DNA/RNA without one -> the sequence alone (single_sequence)
  * a protein chain without an MSA, by `msa.mode`:
      auto             search when `msa.database` is set, else single_sequence
      search           search the database (required)
      single_sequence  no search: the sequence alone
      user_only        reject the chain: every protein must come with its own MSA

Staged MSAs are cached under the cache directory by sequence hash plus what produced them
(`<hash>.user-<file digest>`, `<hash>.search-<database+settings digest>`, `<hash>.single`), so
identical chains across a proteome, and across runs sharing a cache, are staged and searched
once. All chains needing a search in one call go into a single batched MMseqs2 search.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from foldmill.errors import FoldmillError, InputError
from foldmill.io.atomic import atomic_path
from foldmill.io.hashing import file_sha256
from foldmill.msa import colabfold, mmseqs
from foldmill.msa.keys import pairing_key
from foldmill.msa.parse import DEFAULT_MAX_DEPTH, RawRow, a3m_text_rows, read_msa, rows_to_msa
from foldmill.msa.types import MSA

log = logging.getLogger(__name__)

MODES = ("auto", "search", "single_sequence", "user_only")
PROTOCOLS = ("auto", "colabfold", "simple")
MANIFEST_COLUMNS = ["chain_hash", "entity_type", "path", "depth", "source"]
REJECT_COLUMNS = ["chain_hash", "target_ids", "source", "problem"]


@dataclass(frozen=True)
class MSAStagingConfig:
    mode: str = "auto"
    database: str = ""  # FASTA or MMseqs2 database searched for proteins without an MSA
    max_depth: int = DEFAULT_MAX_DEPTH
    cache_dir: str = ""  # "" = <manifest dir>/cache
    search: mmseqs.SearchSettings = field(default_factory=mmseqs.SearchSettings)
    # colabfold: ColabFold's protocol against a ColabFold database directory; simple: one
    # sequence search of a FASTA or MMseqs2 database; auto: colabfold for a ColabFold directory.
    protocol: str = "auto"
    colabfold: colabfold.ColabFoldSettings = field(default_factory=colabfold.ColabFoldSettings)

    @classmethod
    def from_config(cls, section: dict, cache_dir: str = "", threads: int | None = None) -> MSAStagingConfig:
        """From the workflow's `msa:` config section (keys documented in config/README.md)."""
        search = mmseqs.SearchSettings(
            sensitivity=float(section.get("sensitivity", 7.5)),
            evalue=float(section.get("evalue", 0.1)),
            max_seqs=int(section.get("max_seqs", 10000)),
            diversity_filter=bool(section.get("diversity_filter", True)),
            threads=threads,
        )
        threads = int(threads or section.get("threads", 1))
        colabfold_settings = colabfold.ColabFoldSettings(
            threads=threads,
            use_environmental=bool(section.get("use_environmental", True)),
            sensitivity=section.get("colabfold_sensitivity"),
        )
        return cls(
            protocol=section.get("protocol", "auto"),
            colabfold=colabfold_settings,
            mode=section.get("mode", "auto"),
            database=section.get("database", ""),
            max_depth=int(section.get("max_depth", DEFAULT_MAX_DEPTH)),
            cache_dir=cache_dir or section.get("cache_dir", ""),
            search=search,
        )

    def resolved_mode(self) -> str:
        if self.mode not in MODES:
            raise FoldmillError(f"msa.mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        if self.mode == "search" and not self.database:
            raise FoldmillError("msa.mode is 'search' but msa.database is not set (a FASTA file or MMseqs2 database)")
        if self.mode == "auto":
            return "search" if self.database else "single_sequence"
        return self.mode

    def resolved_protocol(self) -> str:
        if self.protocol not in PROTOCOLS:
            raise FoldmillError(f"msa.protocol must be one of {', '.join(PROTOCOLS)}, not {self.protocol!r}")
        if self.protocol == "auto":
            return "colabfold" if colabfold.is_colabfold_directory(self.database) else "simple"
        return self.protocol


@dataclass
class StagingResult:
    manifest: pd.DataFrame
    rejects: pd.DataFrame
    searched: int  # chains searched by this call (not found in the cache)
    seconds: float


def read_chains(path: str | Path) -> pd.DataFrame:
    try:
        table = pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False)
    except (OSError, ValueError) as error:
        raise FoldmillError(f"{path}: cannot read the unique chains table: {error}") from None
    missing = {"chain_hash", "entity_type", "msa", "sequence"} - set(table.columns)
    if missing:
        raise FoldmillError(f"{path}: not a unique_chains table (missing {', '.join(sorted(missing))})")
    return table


def targets_by_chain(worklist_tsv: str | Path | None) -> dict[str, list[str]]:
    """chain_hash -> target ids using it, from a worklist table (for naming targets in rejects)."""
    users: dict[str, list[str]] = defaultdict(list)
    if worklist_tsv is None:
        return users
    table = pd.read_csv(worklist_tsv, sep="\t", dtype=str, keep_default_na=False, usecols=["target_id", "chain_hashes"])
    for target_id, hashes in zip(table["target_id"], table["chain_hashes"]):
        for chain_hash in dict.fromkeys(h for h in hashes.split(",") if h):
            users[chain_hash].append(target_id)
    return users


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


class MSACache:
    """Staged MSAs under `root`: <root>/<hash[:2]>/<hash>.<variant>.npz."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()

    def path(self, chain_hash: str, variant: str) -> Path:
        return self.root / chain_hash[:2] / f"{chain_hash}.{variant}.npz"


def search_variant(config: MSAStagingConfig) -> str:
    if config.resolved_protocol() == "colabfold":
        databases = colabfold.ColabFoldDatabases.find(config.database, config.colabfold.use_environmental)
        signature = "|".join(mmseqs.file_signature(databases.path(name)) for name in databases.names())
        settings = config.colabfold.describe()
    else:
        signature, settings = mmseqs.file_signature(config.database), config.search.describe()
    return "search-" + _digest(f"{signature}|{settings}|depth={config.max_depth}")


def stage_msas(
    chains_tsv: str | Path,
    manifest_path: str | Path,
    config: MSAStagingConfig,
    worklist_tsv: str | Path | None = None,
    rejects_path: str | Path | None = None,
) -> StagingResult:
    """Stage every chain of `chains_tsv`; write the manifest (and rejects) atomically."""
    started = time.perf_counter()
    mode = config.resolved_mode()
    chains = read_chains(chains_tsv)
    manifest_path = Path(manifest_path)
    cache = MSACache(config.cache_dir or manifest_path.parent / "cache" / "msa")
    variant = search_variant(config) if mode == "search" else ""

    rows: dict[str, dict[str, object]] = {}
    rejects: list[dict[str, str]] = []
    to_search: dict[str, str] = {}  # chain_hash -> sequence
    users = targets_by_chain(worklist_tsv)

    def reject(chain_hash: str, source: str, problem: str) -> None:
        log.warning("MSA of chain %s rejected: %s: %s", chain_hash, source, problem)
        rejects.append(
            {
                "chain_hash": chain_hash,
                "target_ids": ",".join(users.get(chain_hash, [])),
                "source": source,
                "problem": problem,
            }
        )

    for chain in chains.itertuples(index=False):
        chain_hash, kind, sequence, given = chain.chain_hash, chain.entity_type, chain.sequence, chain.msa
        if given and given != "empty":
            try:
                path = cache.path(chain_hash, f"user-{file_sha256(given)[:12]}-d{config.max_depth}")
                if not path.is_file():
                    read_msa(given, sequence, config.max_depth).save(path)
            except OSError as error:
                reject(chain_hash, given, f"cannot read MSA: {error.strerror or error}")
                continue
            except InputError as error:
                reject(chain_hash, error.source, f"{error.record + ': ' if error.record else ''}{error.problem}")
                continue
            rows[chain_hash] = _row(chain_hash, kind, path, "user")
        elif given == "empty" or kind != "protein" or mode == "single_sequence":
            path = cache.path(chain_hash, "single")
            if not path.is_file():
                MSA.single_sequence(sequence).save(path)
            rows[chain_hash] = _row(chain_hash, kind, path, "single_sequence")
        elif mode == "user_only":
            reject(chain_hash, str(chains_tsv), "no MSA given for this protein chain and msa.mode is user_only")
        else:
            path = cache.path(chain_hash, variant)
            if path.is_file():
                rows[chain_hash] = _row(chain_hash, kind, path, "search")
            else:
                to_search[chain_hash] = sequence

    if to_search:
        for chain_hash, msa in search_msas(to_search, config, cache.root).items():
            path = cache.path(chain_hash, variant)
            msa.save(path)
            rows[chain_hash] = _row(chain_hash, "protein", path, "search")

    manifest = pd.DataFrame([rows[h] for h in chains["chain_hash"] if h in rows], columns=MANIFEST_COLUMNS)
    reject_table = pd.DataFrame(rejects, columns=REJECT_COLUMNS)
    write_tables({manifest_path: manifest, rejects_path: reject_table})
    seconds = time.perf_counter() - started
    log.info(
        "staged %d MSAs (%d searched, %d rejected) in %.1f s (%.1f MSAs/s)",
        len(manifest), len(to_search), len(reject_table), seconds, len(manifest) / max(seconds, 1e-9),
    )  # fmt: skip
    return StagingResult(manifest, reject_table, len(to_search), seconds)


def write_tables(tables: dict[str | Path | None, pd.DataFrame]) -> None:
    """Write each table as TSV atomically (a None path is skipped)."""
    for path, table in tables.items():
        if path is not None:
            with atomic_path(path) as tmp:
                table.to_csv(tmp, sep="\t", index=False)


def _row(chain_hash: str, kind: str, path: Path, source: str) -> dict[str, object]:
    return {
        "chain_hash": chain_hash,
        "entity_type": kind,
        "path": str(path),
        "depth": MSA.read_depth(path),
        "source": source,
    }


def search_msas(queries: dict[str, str], config: MSAStagingConfig, cache_root: Path) -> dict[str, MSA]:
    """One batched MMseqs2 run over all `queries` (chain_hash -> sequence); their MSAs."""
    cache_root.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=".search.", dir=cache_root))
    protocol = config.resolved_protocol()
    try:
        log.info("searching %d chains against %s (%s protocol)", len(queries), config.database, protocol)
        if protocol == "colabfold":
            rows = colabfold_rows(queries, config, workdir)
        else:
            rows = simple_search_rows(queries, config, workdir, cache_root)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return {
        chain_hash: rows_to_msa(iter(rows[chain_hash]), f"{config.database} (search for {chain_hash})",
                                config.max_depth)
        for chain_hash in queries
    }


def simple_search_rows(
    queries: dict[str, str], config: MSAStagingConfig, workdir: Path, cache_root: Path
) -> dict[str, list[RawRow]]:
    database = mmseqs.target_database(config.database, cache_root)
    hits = mmseqs.search(queries, database, workdir, config.search)
    rows = {}
    for chain_hash, sequence in queries.items():
        rows[chain_hash] = [RawRow(sequence, "", "query")] + [
            RawRow(h.a3m_row(len(sequence)), pairing_key(h.theader), f"hit {h.target}") for h in hits[chain_hash]
        ]
    return rows


def colabfold_rows(queries: dict[str, str], config: MSAStagingConfig, workdir: Path) -> dict[str, list[RawRow]]:
    """ColabFold's unpaired MSAs: UniRef30 rows, then the environmental database's (whose repeated
    query row rows_to_msa drops as a duplicate)."""
    databases = colabfold.ColabFoldDatabases.find(config.database, config.colabfold.use_environmental)
    a3ms, _ = colabfold.search(queries, {}, databases, workdir, config.colabfold)
    return {
        chain_hash: list(a3m_text_rows(a3ms[chain_hash].splitlines(), f"{config.database} (ColabFold search)"))
        for chain_hash in queries
    }
