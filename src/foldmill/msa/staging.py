"""Stage one MSA per distinct polymer chain of a worklist (rule `stage_msas`).

Input: the worklist's `unique_chains.tsv` (one row per sequence hash and MSA given with it) and,
for paired MSAs, the worklist itself. Output:
  msa_manifest.tsv  chain_hash, given_msa, entity_type, path, depth, source, protocol, complex,
                    paired_rows, note
                    given_msa = the MSA the input named (a file, `empty`, or empty = none);
                    path = absolute path of an `MSA.save` .npz; depth = its rows, query included;
                    source = user | search | server | single_sequence | fallback (the search or
                    server failed for it and msa.on_failure is fallback; `note` says why);
                    protocol = colabfold | simple for searched MSAs; complex = "" for a chain's
                    own MSA, else the complex (`complex_key`) whose paired rows lead this MSA;
                    paired_rows = how many rows carry a pairing key
  msa_rejects.tsv   chain_hash, given_msa, target_ids, source, problem, complex   (MSAs that could
                    not be staged; the targets that named them are rejected downstream)
A chain's staged MSA is found by `msa_key(entity)` = (sequence hash, given MSA): a user MSA serves
only the chains that named it, and a chain with the same sequence but no MSA gets its own
(searched or single-sequence) one. In a complex, a searched chain's MSA is first looked up with
the target's `complex_key`, which finds its paired MSA.

Paired MSAs (protocol colabfold, or the server) follow `boltz predict --use_msa_server`: the
distinct protein sequences of a target without an MSA of their own are paired by a taxonomy-paired
search when there are two or more; each chain's MSA is then its paired rows (all-gap rows
dropped, row i keyed by i, the query keyed 0 as in Boltz's CSV) followed by its unpaired rows
without a key, repeats of earlier rows dropped. Unpaired searched MSAs carry no pairing keys, as
in that path.

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
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from foldmill.config import defaults
from foldmill.errors import FoldmillError, InputError
from foldmill.io.hashing import file_sha256
from foldmill.io.tables import read_table, write_tables
from foldmill.io.targets import Entity, Target
from foldmill.io.worklist import load_worklist
from foldmill.msa import colabfold, mmseqs, server
from foldmill.msa.keys import pairing_key
from foldmill.msa.parse import DEFAULT_MAX_DEPTH, RawRow, a3m_text_rows, read_msa, rows_to_msa
from foldmill.msa.types import MSA

log = logging.getLogger(__name__)

MODES = ("auto", "search", "server", "single_sequence", "user_only")
PROTOCOLS = ("auto", "colabfold", "simple")
ON_FAILURE = ("reject", "fallback")
SOURCES = ("user", "search", "server", "single_sequence", "fallback")
MANIFEST_COLUMNS = [
    "chain_hash", "given_msa", "entity_type", "path", "depth", "source", "protocol", "complex", "paired_rows", "note",
]  # fmt: skip
REJECT_COLUMNS = ["chain_hash", "given_msa", "target_ids", "source", "problem", "complex"]
# Columns a manifest of an older foldmill lacks; read as empty.
_OPTIONAL_COLUMNS = {"protocol": "", "complex": "", "paired_rows": "0", "note": ""}
MSAKey = tuple[str, str]  # (sequence hash, MSA given with it: a file, "empty" or "")
# Bumped when searched MSAs are staged differently, so cached ones are not reused.
SEARCH_FORMAT = "2"
MAX_PAIRED_ROWS = 8192  # Boltz's const.max_paired_seqs: paired rows kept per chain
MAX_BOLTZ_ROWS = 16384  # Boltz's const.max_msa_seqs: paired plus unpaired raw rows per chain


def msa_key(entity: Entity) -> MSAKey:
    """Which staged MSA a polymer entity uses: its sequence together with the MSA its input named."""
    return entity.sequence_hash(), entity.msa or ""


def pairing_chains(target: Target) -> list[tuple[str, str]]:
    """(sequence hash, sequence) of the chains a search pairs, as `boltz predict --use_msa_server` picks
    them: the target's distinct protein sequences without an MSA of their own, in entity order."""
    chains: dict[str, str] = {}
    for entity in target.entities:
        if entity.entity_type == "protein" and not entity.msa and entity.sequence:
            chains.setdefault(entity.sequence_hash(), entity.sequence)
    return list(chains.items())


def complex_key(target: Target) -> str:
    """The key of the target's paired MSAs: its pairing chains in order; "" when fewer than two."""
    chains = pairing_chains(target)
    return _digest("\n".join(chain_hash for chain_hash, _ in chains)) if len(chains) > 1 else ""


def staged_keys(target: Target, entity: Entity) -> list[tuple[str, str, str]]:
    """The manifest and rejects rows (msa_key, complex) that may hold `entity`'s MSA in `target`, in
    the order they apply: the target's complex row (paired rows, or the complex's rejection) before
    the chain's own."""
    key, group = msa_key(entity), complex_key(target)
    return [(*key, group), (*key, "")] if group else [(*key, "")]


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
    # a chain (or complex) the search or server could not answer: reject its targets, or fold it
    # from its sequence alone (a complex: from its chains' unpaired MSAs)
    on_failure: str = "reject"
    gpu: str = "auto"  # MMseqs2's GPU search for the colabfold protocol: auto | on | off
    index_max_gb: float = 32.0  # colabfold protocol: build a private index of an unindexed database up to this size

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
            on_failure=section["on_failure"],
            gpu={True: "on", False: "off"}.get(section["gpu"], section["gpu"]),  # YAML reads on/off as booleans
            index_max_gb=float(section["index_max_gb"]),
        )

    def resolved_mode(self) -> str:
        if self.mode not in MODES:
            raise FoldmillError(f"msa.mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        if self.mode == "search" and not self.database:
            raise FoldmillError("msa.mode is 'search' but msa.database is not set (a FASTA file or MMseqs2 database)")
        if self.mode == "auto":
            return "search" if self.database else "single_sequence"
        return self.mode

    def pairs_complexes(self) -> bool:
        """Whether complexes get paired MSAs: ColabFold's protocol, locally or from the server."""
        mode = self.resolved_mode()
        return mode == "server" or (mode == "search" and self.resolved_protocol() == "colabfold")

    def colabfold_settings(self, databases: colabfold.ColabFoldDatabases) -> colabfold.ColabFoldSettings:
        """The colabfold protocol's settings, with msa.gpu resolved for this machine and database."""
        return replace(self.colabfold, gpu=colabfold.use_gpu(self.gpu, databases))

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


def targets_by_msa_key(worklist_tsv: str | Path | None) -> dict[tuple[str, str, str], list[str]]:
    """(msa_key, complex) -> ids of the targets using it, from a worklist table (for naming targets in
    rejects): complex "" = every target using the MSA, a complex key = only that complex's targets."""
    users: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    if worklist_tsv is None:
        return users
    for target in load_worklist(worklist_tsv):
        group = complex_key(target)
        for key in dict.fromkeys(msa_key(e) for e in target.entities if e.is_polymer):
            users[(*key, "")].append(target.target_id)
            if group:
                users[(*key, group)].append(target.target_id)
    return users


def read_msa_manifest(path: str | Path) -> pd.DataFrame:
    """An msa_manifest.tsv written by `stage_msas` (depth and paired_rows as int, the rest text); the
    columns an older foldmill did not write read as empty."""
    return _with_optional(path, MANIFEST_COLUMNS, "MSA manifest").astype({"depth": int, "paired_rows": int})


def read_msa_rejects(path: str | Path) -> pd.DataFrame:
    """An msa_rejects.tsv written by `stage_msas` (all text)."""
    return _with_optional(path, REJECT_COLUMNS, "MSA rejects table")


def _with_optional(path: str | Path, columns: list[str], what: str) -> pd.DataFrame:
    try:
        present = pd.read_csv(path, sep="\t", nrows=0).columns
    except (OSError, ValueError) as error:
        raise FoldmillError(f"{path}: cannot read the {what}: {error}") from None
    required = [column for column in columns if column not in _OPTIONAL_COLUMNS or column in present]
    table = read_table(path, required, what)
    for column in columns:
        if column not in table.columns:
            table[column] = _OPTIONAL_COLUMNS[column]
    return table[columns]


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
        return "server-" + _digest(f"{config.server.describe()}|depth={config.max_depth}|v{SEARCH_FORMAT}")
    if config.resolved_protocol() == "colabfold":
        databases = colabfold.ColabFoldDatabases.find(config.database, config.colabfold.use_environmental)
        signature = "|".join(mmseqs.file_signature(databases.path(name)) for name in databases.names())
        settings = f"{config.colabfold_settings(databases).describe()}|v{SEARCH_FORMAT}"
    else:
        try:
            signature, settings = mmseqs.file_signature(config.database), config.search.describe()
        except OSError as error:
            raise FoldmillError(f"{config.database}: sequence database cannot be read ({error.strerror})") from None
    return "search-" + _digest(f"{signature}|{settings}|depth={config.max_depth}")


def pairing_groups(worklist_tsv: str | Path | None) -> dict[str, list[tuple[str, str]]]:
    """complex_key -> its pairing chains, for every target of the worklist that has one."""
    groups: dict[str, list[tuple[str, str]]] = {}
    if worklist_tsv is None:
        return groups
    for target in load_worklist(worklist_tsv):
        key = complex_key(target)
        if key:
            groups.setdefault(key, pairing_chains(target))
    return groups


def stage_msas(
    chains_tsv: str | Path,
    manifest_path: str | Path,
    config: MSAStagingConfig,
    worklist_tsv: str | Path | None = None,
    rejects_path: str | Path | None = None,
) -> StagingResult:
    """Stage every (chain, given MSA) of `chains_tsv`, and the paired MSAs of the worklist's complexes;
    write the manifest (and rejects) atomically."""
    started = time.perf_counter()
    mode = config.resolved_mode()
    if config.on_failure not in ON_FAILURE:
        raise FoldmillError(f"msa.on_failure must be one of {', '.join(ON_FAILURE)}, not {config.on_failure!r}")
    chains = read_chains(chains_tsv)
    manifest_path = Path(manifest_path)
    cache = MSACache(config.cache_dir or manifest_path.parent / "cache" / "msa")
    searched_source = "server" if mode == "server" else "search"
    protocol = "colabfold" if mode == "server" else config.resolved_protocol() if mode == "search" else ""
    where = config.server.base_url if mode == "server" else config.database
    variant, unusable = "", ""
    if mode in ("search", "server"):
        try:
            variant = search_variant(config)
        except FoldmillError as error:  # a missing, half-built or wrong database: no chain can be searched
            unusable = str(error)
            log.error("msa: %s", unusable)

    rows: dict[tuple[str, str, str], dict[str, object]] = {}  # (chain hash, given MSA, complex) -> row
    rejects: list[dict[str, str]] = []
    to_search: dict[str, str] = {}  # chain_hash -> sequence
    users: dict[tuple[str, str, str], list[str]] | None = None  # read from the worklist at the first reject

    def stage(key: MSAKey, kind: str, path: Path, source: str, complex_id: str = "", note: str = "") -> None:
        msa_protocol = protocol if source in ("search", "server") or (source == "fallback" and complex_id) else ""
        paired = MSA.load(path).keys if complex_id else None
        rows[(*key, complex_id)] = {
            "chain_hash": key[0], "given_msa": key[1], "entity_type": kind, "path": str(path),
            "depth": MSA.read_depth(path), "source": source, "protocol": msa_protocol, "complex": complex_id,
            "paired_rows": 0 if paired is None else int((paired != "").sum()), "note": note,
        }  # fmt: skip

    def reject(key: MSAKey, source: str, problem: str, complex_id: str = "") -> None:
        nonlocal users
        users = targets_by_msa_key(worklist_tsv) if users is None else users
        log.warning("MSA %s of chain %s rejected: %s: %s", key[1] or "(none given)", key[0], source, problem)
        target_ids = ",".join(users.get((*key, complex_id), []))  # a complex's failure: its targets only
        rejects.append({"chain_hash": key[0], "given_msa": key[1], "target_ids": target_ids, "source": source,
                        "problem": problem, "complex": complex_id})  # fmt: skip

    def failed(chain_hash: str, sequence: str, problem: str) -> None:
        """A chain the search or server could not answer: rejected, or single-sequence by msa.on_failure."""
        if config.on_failure == "fallback":
            path = cache.path(chain_hash, "single")
            if not path.is_file():
                MSA.single_sequence(sequence).save(path)
            stage((chain_hash, ""), "protein", path, "fallback", note=problem)
        else:
            reject((chain_hash, ""), where, problem)

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
        elif unusable:
            failed(chain_hash, sequence, unusable)
        elif cache.path(chain_hash, variant).is_file():
            stage(key, kind, cache.path(chain_hash, variant), searched_source)
        else:
            to_search[chain_hash] = sequence

    groups = pairing_groups(worklist_tsv) if not unusable and config.pairs_complexes() else {}
    pair_variant = f"pair{{}}-{variant}"  # per complex
    to_pair = {
        complex_id: [sequence for _, sequence in members]
        for complex_id, members in groups.items()
        if not all(cache.path(h, pair_variant.format(complex_id)).is_file() for h, _ in members)
    }
    paired_a3ms: dict[str, list[str]] = {}
    if to_search or to_pair:
        msas, paired_a3ms, problems = search_msas(to_search, to_pair, config, cache.root)
        for chain_hash, msa in msas.items():
            msa.save(cache.path(chain_hash, variant))
            stage((chain_hash, ""), "protein", cache.path(chain_hash, variant), searched_source)
        for chain_hash, sequence in to_search.items():
            if chain_hash not in msas:
                failed(chain_hash, sequence, problems.get(chain_hash, f"{where}: no MSA returned"))
    else:
        problems = {}

    for complex_id, members in groups.items():
        unpaired = {h: rows.get((h, "", "")) for h, _ in members}
        if any(row is None or row["source"] not in ("search", "server") for row in unpaired.values()):
            continue  # a chain without a searched MSA: the target is rejected or folds from its fallback
        problem = ""
        if complex_id in to_pair:
            try:
                combine_paired(complex_id, members, paired_a3ms, unpaired, where, cache, pair_variant, config)
            except (InputError, IndexError) as error:
                problem = f"{where}: malformed paired MSA of complex {complex_id}: {error}"
            except KeyError:
                problem = problems.get(complex_id, f"{where}: no paired MSA returned")
        for chain_hash, _ in members:
            if not problem:
                stage((chain_hash, ""), "protein", cache.path(chain_hash, pair_variant.format(complex_id)),
                      searched_source, complex_id)  # fmt: skip
            elif config.on_failure == "fallback":
                path = Path(str(unpaired[chain_hash]["path"]))
                stage((chain_hash, ""), "protein", path, "fallback", complex_id, f"unpaired only: {problem}")
            else:
                reject((chain_hash, ""), where, f"paired MSA: {problem}", complex_id)

    order = list(zip(chains["chain_hash"], chains["msa"], [""] * len(chains))) + sorted(
        key for key in rows if key[2]
    )
    manifest = pd.DataFrame([rows[key] for key in order if key in rows], columns=MANIFEST_COLUMNS)
    reject_table = pd.DataFrame(rejects, columns=REJECT_COLUMNS)
    write_tables({manifest_path: manifest, rejects_path: reject_table})
    seconds = time.perf_counter() - started
    log.info(
        "staged %d MSAs (%d searched, %d complexes paired, %d rejected) in %.1f s (%.1f MSAs/s)",
        len(manifest), len(to_search), len(to_pair), len(reject_table), seconds, len(manifest) / max(seconds, 1e-9),
    )  # fmt: skip
    for warning in (single_sequence_warning(config, manifest), fallback_warning(manifest)):
        if warning:
            log.warning("%s", warning)
    return StagingResult(manifest, reject_table, len(to_search), seconds)


def combine_paired(
    complex_id: str, members: list[tuple[str, str]], paired_a3ms: dict[str, list[str]], unpaired: dict,
    where: str, cache: MSACache, pair_variant: str, config: MSAStagingConfig,
) -> None:
    """Save each chain's MSA in the complex (paired_chain_msa); KeyError if the search returned none."""
    a3ms = paired_a3ms[complex_id]
    label = f"{where} (paired search, complex {complex_id})"
    combined = [
        paired_chain_msa(a3ms[position], MSA.load(str(unpaired[chain_hash]["path"])), label, config.max_depth)
        for position, (chain_hash, _) in enumerate(members)
    ]
    for (chain_hash, _), msa in zip(members, combined):
        msa.save(cache.path(chain_hash, pair_variant.format(complex_id)))


def paired_chain_msa(paired_a3m: str, unpaired: MSA, source: str, max_depth: int) -> MSA:
    """One chain's MSA in a complex, as Boltz builds it from a paired search (its main.compute_msa
    and parse_csv): the paired rows (at most MAX_PAIRED_ROWS; all-gap rows, where the chain has no
    partner, dropped; row i keyed i), then the chain's unpaired rows but its query, unkeyed, a row
    repeating an earlier one dropped, at most max_depth rows.

    `unpaired` is the chain's staged unpaired MSA, already without repeats and capped at max_depth
    (Boltz caps its raw rows at MAX_BOLTZ_ROWS before dropping repeats, which differs only when
    more than that many raw rows would be needed)."""
    raw = list(a3m_text_rows(paired_a3m.splitlines(), source))[:MAX_PAIRED_ROWS]
    keyed = [RawRow(row.text, str(i), row.record) for i, row in enumerate(raw) if row.text != "-" * len(row.text)]
    paired = rows_to_msa(iter(keyed), source, max_depth, keep_keyed_duplicates=True)
    if paired.length != unpaired.length:
        raise InputError(source, None, f"paired rows have {paired.length} columns, the chain {unpaired.length}")
    if unpaired.fingerprints is None:
        raise InputError(source, None, "the unpaired MSA has no row fingerprints (stage it again)")
    seen = set(paired.fingerprints.tolist())
    extra = [row for row in range(1, unpaired.depth) if int(unpaired.fingerprints[row]) not in seen]
    extra = extra[: max(0, min(max_depth, MAX_BOLTZ_ROWS) - paired.depth)]
    rest = unpaired.select_rows(np.array(extra, dtype=np.int64))
    return MSA(
        np.concatenate([paired.residues, rest.residues]),
        np.concatenate([paired.deletions, rest.deletions]),
        np.concatenate([paired.keys.astype(str), np.full(len(extra), "", dtype=paired.keys.dtype)]),
        np.concatenate([paired.fingerprints, rest.fingerprints]),
    )


def single_sequence_warning(config: MSAStagingConfig, manifest: pd.DataFrame) -> str:
    """One line when a run that expected searched MSAs has protein chains with only their own sequence
    (no database configured, or no homolog found); "" otherwise. Chains given `msa: empty` and
    fallbacks (fallback_warning) do not count."""
    if config.mode not in ("auto", "search", "server"):
        return ""
    proteins = manifest[(manifest["entity_type"] == "protein") & (manifest["complex"] == "")]
    searched_or_single = proteins["source"].isin(["search", "server", "single_sequence"])
    alone = proteins[(proteins["depth"].astype(int) <= 1) & searched_or_single]
    alone = alone[alone["given_msa"] != "empty"]
    if alone.empty:
        return ""
    if not config.database and config.mode == "auto":
        why = "msa.mode is auto and no msa.database is set"
    else:
        where = config.server.base_url if config.mode == "server" else config.database
        why = f"the search found no homolog in {where}"
    return (
        f"msa: {len(alone)} of {len(proteins)} protein chains (distinct sequence and MSA) "
        f"have single-sequence MSAs ({why})"
    )


def fallback_warning(manifest: pd.DataFrame) -> str:
    """One line naming how many chains and complexes fell back (msa.on_failure: fallback), and the first reason."""
    fallen = manifest[manifest["source"] == "fallback"]
    if fallen.empty:
        return ""
    chains = int((fallen["complex"] == "").sum())
    complexes = fallen.loc[fallen["complex"] != "", "complex"].nunique()
    return (
        f"msa: {chains} chains fell back to their sequence alone and {complexes} complexes to unpaired MSAs "
        f"(msa.on_failure is fallback); first: {fallen['note'].iloc[0]}"
    )


def search_msas(
    queries: dict[str, str], complexes: dict[str, list[str]], config: MSAStagingConfig, cache_root: Path
) -> tuple[dict[str, MSA], dict[str, list[str]], dict[str, str]]:
    """One batched run over all `queries` (chain_hash -> sequence) and `complexes` (complex_key -> its
    pairing chains' sequences): the chains' unpaired MSAs, each complex's paired A3Ms (one per chain),
    and a one-line problem per chain hash or complex key left without (a local search fails as a
    whole, the server per ticket)."""
    cache_root.mkdir(parents=True, exist_ok=True)
    problems: dict[str, str] = {}
    paired: dict[str, list[str]] = {}
    keyless = True
    if config.resolved_mode() == "server":
        log.info("asking %s for the MSAs of %d chains and %d complexes", config.server.url, len(queries),
                 len(complexes))  # fmt: skip
        a3ms, paired, problems = server.search_each(queries, complexes, cache_root / "server", config.server)
        rows = {name: list(a3m_text_rows(a3m.splitlines(), config.server.url)) for name, a3m in a3ms.items()}
    else:
        workdir = Path(tempfile.mkdtemp(prefix=".search.", dir=cache_root))
        protocol = config.resolved_protocol()
        try:
            log.info("searching %d chains and %d complexes against %s (%s protocol)", len(queries), len(complexes),
                     config.database, protocol)  # fmt: skip
            if protocol == "colabfold":
                rows, paired = colabfold_rows(queries, complexes, config, workdir, cache_root)
            else:
                rows, keyless = simple_search_rows(queries, config, workdir, cache_root), False
        except FoldmillError as error:
            problem = f"{config.database}: {error}" if config.database not in str(error) else str(error)
            log.error("msa: %s", problem)
            return {}, {}, {name: problem for name in [*queries, *complexes]}
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    source = config.server.url if config.resolved_mode() == "server" else config.database
    msas = {}
    for chain_hash, chain_rows in rows.items():
        if keyless:  # ColabFold's A3Ms: Boltz keys none of these rows (its CSV's -1)
            chain_rows = [RawRow(row.text, "", row.record) for row in chain_rows]
        try:
            msas[chain_hash] = rows_to_msa(iter(chain_rows), f"{source} (search for {chain_hash})", config.max_depth)
        except InputError as error:
            problems[chain_hash] = str(error)
    return msas, paired, problems


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


def colabfold_rows(
    queries: dict[str, str], complexes: dict[str, list[str]], config: MSAStagingConfig, workdir: Path,
    cache_root: Path,
) -> tuple[dict[str, list[RawRow]], dict[str, list[str]]]:
    """ColabFold's unpaired MSAs (UniRef30 rows, then the environmental database's, whose repeated
    query row rows_to_msa drops as a duplicate) and the complexes' paired A3Ms."""
    databases = colabfold.ColabFoldDatabases.find(config.database, config.colabfold.use_environmental)
    settings = config.colabfold_settings(databases)
    if complexes:
        databases.check_pairing()
    a3ms, paired = search_while_indexing(queries, complexes, databases, workdir, settings, cache_root,
                                         config.index_max_gb)  # fmt: skip
    rows = {
        chain_hash: list(a3m_text_rows(a3ms[chain_hash].splitlines(), f"{config.database} (ColabFold search)"))
        for chain_hash in queries
    }
    return rows, paired


def search_while_indexing(
    queries: dict[str, str], complexes: dict[str, list[str]], databases: colabfold.ColabFoldDatabases,
    workdir: Path, settings: colabfold.ColabFoldSettings, cache_root: Path, index_max_gb: float,
) -> tuple[dict[str, str], dict[str, list[str]]]:
    """colabfold.search, through the private MMseqs2 index (msa.index_max_gb) from the second
    search of the same databases on: the first search runs without one.

    Building an index costs about what one run's prefilter steps spend building their k-mer
    tables without it (measured in docs/benchmarks/msa.md), so it pays only when the databases
    are searched again, and a single run should not pay for it. Results are the same either way."""
    if settings.gpu:  # the GPU search reads its own padded layout
        return colabfold.search(queries, complexes, databases, workdir, settings)
    indexed = colabfold.with_search_index(databases, cache_root, settings.threads, index_max_gb, build=False)
    if indexed is databases and not colabfold.searched_before(databases, cache_root):
        result = colabfold.search(queries, complexes, databases, workdir, settings)
        colabfold.mark_searched(databases, cache_root)
        return result
    indexed = colabfold.with_search_index(databases, cache_root, settings.threads, index_max_gb)
    return colabfold.search(queries, complexes, indexed, workdir, settings)
