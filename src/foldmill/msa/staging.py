"""Stage one MSA per distinct polymer chain of a worklist (rule `stage_msas`).

Input: the worklist's `unique_chains.tsv` (one row per sequence hash and MSA given with it). Output:
  msa_manifest.tsv  chain_hash, given_msa, entity_type, path, depth, source
                    given_msa = the MSA the input named (a file, `empty`, or empty = none);
                    path = absolute path of an `MSA.save` .npz; depth = its rows, query included;
                    source = user | search | single_sequence
  msa_rejects.tsv   chain_hash, given_msa, target_ids, source, problem   (MSAs that could not be
                    staged; the targets that named them are rejected downstream)
A chain's staged MSA is found by `msa_key(entity)` = (sequence hash, given MSA): a user MSA serves
only the chains that named it, and a chain with the same sequence but no MSA gets its own
(searched or single-sequence) one.

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

from foldmill.config import defaults
from foldmill.errors import FoldmillError, InputError
from foldmill.io.hashing import file_sha256
from foldmill.io.tables import read_table, write_tables
from foldmill.io.targets import Entity
from foldmill.io.worklist import load_worklist
from foldmill.msa import colabfold, mmseqs, server
from foldmill.msa.keys import pairing_key
from foldmill.msa.parse import DEFAULT_MAX_DEPTH, RawRow, a3m_text_rows, read_msa, rows_to_msa
from foldmill.msa.types import MSA

log = logging.getLogger(__name__)

MODES = ("auto", "search", "server", "single_sequence", "user_only")
PROTOCOLS = ("auto", "colabfold", "simple")
MANIFEST_COLUMNS = ["chain_hash", "given_msa", "entity_type", "path", "depth", "source"]
REJECT_COLUMNS = ["chain_hash", "given_msa", "target_ids", "source", "problem"]
MSAKey = tuple[str, str]  # (sequence hash, MSA given with it: a file, "empty" or "")


def msa_key(entity: Entity) -> MSAKey:
    """Which staged MSA a polymer entity uses: its sequence together with the MSA its input named."""
    return entity.sequence_hash(), entity.msa or ""


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
    server: server.ServerSettings = field(default_factory=server.ServerSettings)  # msa.mode server

    @classmethod
    def from_config(cls, section: dict, cache_dir: str = "", threads: int | None = None) -> MSAStagingConfig:
        """From the workflow's `msa:` config section (keys documented in config/README.md); a key it
        lacks takes the schema's default."""
        section = {**defaults("msa"), **section}
        search = mmseqs.SearchSettings(
            sensitivity=float(section["sensitivity"]),
            evalue=float(section["evalue"]),
            max_seqs=int(section["max_seqs"]),
            diversity_filter=bool(section["diversity_filter"]),
            threads=int(threads or section["threads"]),
        )
        colabfold_settings = colabfold.ColabFoldSettings(
            threads=search.threads,
            use_environmental=bool(section["use_environmental"]),
            sensitivity=section["colabfold_sensitivity"],
        )
        return cls(
            protocol=section["protocol"],
            colabfold=colabfold_settings,
            server=server.ServerSettings.from_config(section),
            mode=section["mode"],
            database=section["database"],
            max_depth=int(section["max_depth"]),
            cache_dir=cache_dir or section["cache_dir"],
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


def targets_by_msa_key(worklist_tsv: str | Path | None) -> dict[MSAKey, list[str]]:
    """msa_key -> ids of the targets using it, from a worklist table (for naming targets in rejects)."""
    users: dict[MSAKey, list[str]] = defaultdict(list)
    if worklist_tsv is None:
        return users
    for target in load_worklist(worklist_tsv):
        for key in dict.fromkeys(msa_key(e) for e in target.entities if e.is_polymer):
            users[key].append(target.target_id)
    return users


def read_msa_manifest(path: str | Path) -> pd.DataFrame:
    """An msa_manifest.tsv written by `stage_msas` (depth as int, the rest text)."""
    return read_table(path, MANIFEST_COLUMNS, "MSA manifest").astype({"depth": int})


def read_msa_rejects(path: str | Path) -> pd.DataFrame:
    """An msa_rejects.tsv written by `stage_msas` (all text)."""
    return read_table(path, REJECT_COLUMNS, "MSA rejects table")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


class MSACache:
    """Staged MSAs under `root`: <root>/<hash[:2]>/<hash>.<variant>.npz."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()

    def path(self, chain_hash: str, variant: str) -> Path:
        return self.root / chain_hash[:2] / f"{chain_hash}.{variant}.npz"


def search_variant(config: MSAStagingConfig) -> str:
    """The cache name of searched MSAs: what produced them (database or server, and settings)."""
    if config.resolved_mode() == "server":
        return "server-" + _digest(f"{config.server.describe()}|depth={config.max_depth}")
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
    """Stage every (chain, given MSA) of `chains_tsv`; write the manifest (and rejects) atomically."""
    started = time.perf_counter()
    mode = config.resolved_mode()
    chains = read_chains(chains_tsv)
    manifest_path = Path(manifest_path)
    cache = MSACache(config.cache_dir or manifest_path.parent / "cache" / "msa")
    variant = search_variant(config) if mode in ("search", "server") else ""

    rows: dict[MSAKey, dict[str, object]] = {}
    rejects: list[dict[str, str]] = []
    to_search: dict[str, str] = {}  # chain_hash -> sequence
    users: dict[MSAKey, list[str]] | None = None  # read from the worklist at the first reject

    def stage(key: MSAKey, kind: str, path: Path, source: str) -> None:
        rows[key] = {
            "chain_hash": key[0], "given_msa": key[1], "entity_type": kind, "path": str(path),
            "depth": MSA.read_depth(path), "source": source,
        }  # fmt: skip

    def reject(key: MSAKey, source: str, problem: str) -> None:
        nonlocal users
        users = targets_by_msa_key(worklist_tsv) if users is None else users
        log.warning("MSA %s of chain %s rejected: %s: %s", key[1] or "(none given)", key[0], source, problem)
        target_ids = ",".join(users.get(key, []))
        rejects.append(
            {"chain_hash": key[0], "given_msa": key[1], "target_ids": target_ids, "source": source, "problem": problem}
        )

    for chain in chains.itertuples(index=False):
        key: MSAKey = (chain.chain_hash, chain.msa)
        chain_hash, kind, sequence, given = chain.chain_hash, chain.entity_type, chain.sequence, chain.msa
        if given and given != "empty":
            try:
                path = cache.path(chain_hash, f"user-{file_sha256(given)[:12]}-d{config.max_depth}")
                if not path.is_file():
                    read_msa(given, sequence, config.max_depth).save(path)
            except OSError as error:
                reject(key, given, f"cannot read MSA: {error.strerror or error}")
                continue
            except InputError as error:
                reject(key, error.source, f"{error.record + ': ' if error.record else ''}{error.problem}")
                continue
            stage(key, kind, path, "user")
        elif given == "empty" or kind != "protein" or mode == "single_sequence":
            path = cache.path(chain_hash, "single")
            if not path.is_file():
                MSA.single_sequence(sequence).save(path)
            stage(key, kind, path, "single_sequence")
        elif mode == "user_only":
            reject(key, str(chains_tsv), "no MSA given for this protein chain and msa.mode is user_only")
        elif cache.path(chain_hash, variant).is_file():
            stage(key, kind, cache.path(chain_hash, variant), "search")
        else:
            to_search[chain_hash] = sequence

    if to_search:
        msas, problems = search_msas(to_search, config, cache.root)
        for chain_hash, msa in msas.items():
            msa.save(cache.path(chain_hash, variant))
            stage((chain_hash, ""), "protein", cache.path(chain_hash, variant), "search")
        for chain_hash, problem in problems.items():
            reject((chain_hash, ""), config.server.url, problem)

    order = zip(chains["chain_hash"], chains["msa"])
    manifest = pd.DataFrame([rows[key] for key in order if key in rows], columns=MANIFEST_COLUMNS)
    reject_table = pd.DataFrame(rejects, columns=REJECT_COLUMNS)
    write_tables({manifest_path: manifest, rejects_path: reject_table})
    seconds = time.perf_counter() - started
    log.info(
        "staged %d MSAs (%d searched, %d rejected) in %.1f s (%.1f MSAs/s)",
        len(manifest), len(to_search), len(reject_table), seconds, len(manifest) / max(seconds, 1e-9),
    )  # fmt: skip
    warning = single_sequence_warning(config, manifest)
    if warning:
        log.warning("%s", warning)
    return StagingResult(manifest, reject_table, len(to_search), seconds)


def single_sequence_warning(config: MSAStagingConfig, manifest: pd.DataFrame) -> str:
    """One line when a run that expected searched MSAs has protein chains with only their own sequence
    (no database configured, or no homolog found); "" otherwise. Chains given `msa: empty` do not count."""
    if config.mode not in ("auto", "search", "server"):
        return ""
    proteins = manifest[manifest["entity_type"] == "protein"]
    alone = proteins[(proteins["depth"].astype(int) <= 1) & (proteins["source"] != "user")]
    alone = alone[alone["given_msa"] != "empty"]
    if alone.empty:
        return ""
    why = "msa.mode is auto and no msa.database is set" if not config.database else "the search found no homolog"
    return (
        f"msa: {len(alone)} of {len(proteins)} protein chains (distinct sequence and MSA) "
        f"have single-sequence MSAs ({why})"
    )


def search_msas(
    queries: dict[str, str], config: MSAStagingConfig, cache_root: Path
) -> tuple[dict[str, MSA], dict[str, str]]:
    """One batched run over all `queries` (chain_hash -> sequence): their MSAs, and a one-line problem
    for each query the MSA server could not answer (a local search fails as a whole)."""
    cache_root.mkdir(parents=True, exist_ok=True)
    problems: dict[str, str] = {}
    if config.resolved_mode() == "server":
        log.info("asking %s for the MSAs of %d chains", config.server.url, len(queries))
        a3ms, _, problems = server.search_each(queries, {}, cache_root / "server", config.server)
        rows = {name: list(a3m_text_rows(a3m.splitlines(), config.server.url)) for name, a3m in a3ms.items()}
    else:
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
    source = config.server.url if config.resolved_mode() == "server" else config.database
    msas = {
        chain_hash: rows_to_msa(iter(chain_rows), f"{source} (search for {chain_hash})", config.max_depth)
        for chain_hash, chain_rows in rows.items()
    }
    return msas, problems


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
