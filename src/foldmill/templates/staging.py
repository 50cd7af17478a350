"""Stage template alignments for every target of a worklist (rule `stage_templates`).

Output:
  templates_manifest.tsv  target_id, chain_id, template_id, path, source, force, threshold
                          one row per (target, query chain, template); path = absolute path of
                          a `TemplateAlignment` .npz; source = user | search; force/threshold
                          as given with user templates (searched ones: False, empty).
                          Header only when no target has templates.
  templates_rejects.tsv   target_id, source, problem   (user templates that could not be used;
                          the problem names the file. A bad template leaves out all of its
                          target's user templates, one that does not align to a chain only that
                          chain's; the target folds without them and the run summary lists them
                          in its `warnings` column)

User templates (YAML `templates:`, sheet `template` column) apply to the query chains they name
(all protein chains if none); template chains named with them are paired in order, otherwise
each query chain gets the best-scoring distinct template chain. With `templates.seqres` and
`templates.mmcif_dir` configured, protein chains without a user template are searched (one
batched MMseqs2 search per call, results cached by sequence hash and search settings).
Templates are protein-only.
"""

from __future__ import annotations

import hashlib
import logging
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from foldmill.config import defaults
from foldmill.errors import FoldmillError, InputError
from foldmill.io.atomic import write_text_atomic
from foldmill.io.tables import read_table, write_tables
from foldmill.io.targets import Target
from foldmill.io.worklist import load_worklist
from foldmill.msa import mmseqs
from foldmill.templates.align import align_template, assign_chains
from foldmill.templates.search import TemplateSearchConfig, search_templates
from foldmill.templates.structure import TemplateStructure, read_template
from foldmill.templates.types import TemplateAlignment

log = logging.getLogger(__name__)

MANIFEST_COLUMNS = ["target_id", "chain_id", "template_id", "path", "source", "force", "threshold"]
REJECT_COLUMNS = ["target_id", "source", "problem"]
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_INDEX = "templates.tsv"  # per searched chain: the chosen template ids, written last (= done)


@dataclass(frozen=True)
class TemplateStagingConfig:
    search: TemplateSearchConfig | None = None
    cache_dir: str = ""  # "" = <manifest dir>/cache/templates

    @classmethod
    def from_config(cls, section: dict, cache_dir: str = "", threads: int | None = None) -> TemplateStagingConfig:
        """From the workflow's `templates:` config section (a key it lacks takes the schema's default);
        searching needs seqres and mmcif_dir."""
        section = {**defaults("templates"), **section}
        seqres, mmcif_dir = section["seqres"], section["mmcif_dir"]
        cache_dir = cache_dir or section["cache_dir"]
        if not seqres:
            return cls(None, cache_dir)
        if not mmcif_dir:
            raise FoldmillError(
                "templates.seqres is set but templates.mmcif_dir is not (the directory of template mmCIF files)"
            )
        settings = mmseqs.SearchSettings(
            sensitivity=float(section["sensitivity"]),
            evalue=float(section["evalue"]),
            max_seqs=int(section["max_seqs"]),
            diversity_filter=False,
            threads=int(threads or section["threads"]),
        )
        search = TemplateSearchConfig(
            seqres=seqres,
            mmcif_dir=mmcif_dir,
            max_release_date=str(section["max_release_date"] or ""),
            top_k=int(section["top_k"]),
            search=settings,
        )
        return cls(search, cache_dir)


@dataclass
class TemplateStagingResult:
    manifest: pd.DataFrame
    rejects: pd.DataFrame
    searched: int


def _protein_chains(target: Target) -> dict[str, str]:
    return {cid: e.sequence or "" for e in target.entities if e.entity_type == "protein" for cid in e.chain_ids}


def user_template_alignments(
    target: Target, structures: dict[str, TemplateStructure], unaligned: list[tuple[str, str]] | None = None
) -> list[tuple[str, TemplateAlignment, bool, float | None]]:
    """(query chain, alignment, force, threshold) for each user template of `target`; InputError if unusable.

    A template chain that does not align to its query chain is left out, with (template path, problem)
    appended to `unaligned`."""
    proteins = _protein_chains(target)
    results = []
    for template in target.templates:
        if template.path not in structures:
            structures[template.path] = read_template(template.path)
        structure = structures[template.path]
        queries = (
            {cid: proteins[cid] for cid in template.chain_ids if cid in proteins} if template.chain_ids else proteins
        )
        if not queries:
            raise InputError(
                target.source, target.record, f"template {template.path} names no protein chain of the target"
            )
        unknown = [cid for cid in template.template_chain_ids if cid not in structure.chains]
        if unknown:
            raise InputError(
                template.path, None,
                f"has no protein chain {', '.join(unknown)} (protein chains: {', '.join(structure.chains) or 'none'})",
            )  # fmt: skip
        if template.template_chain_ids:
            if len(template.template_chain_ids) != len(queries):
                problem = f"{len(queries)} query chain(s) but {len(template.template_chain_ids)} template chain(s)"
                raise InputError(target.source, target.record, f"template {template.path}: {problem}")
            pairs = list(zip(queries, template.template_chain_ids, strict=True))
        else:
            pairs = assign_chains(queries, {cid: chain.sequence for cid, chain in structure.chains.items()})
        for query_chain, template_chain in pairs:
            alignment = align_template(queries[query_chain], structure, structure.chains[template_chain])
            if len(alignment):
                results.append((query_chain, alignment, template.force, template.threshold))
            else:
                problem = f"{template.path}: template {alignment.template_id} does not align to chain {query_chain}"
                log.warning("%s: %s", target.target_id, problem)
                if unaligned is not None:
                    unaligned.append((template.path, problem))
    return results


def stage_templates(
    worklist_tsv: str | Path,
    manifest_path: str | Path,
    config: TemplateStagingConfig,
    rejects_path: str | Path | None = None,
) -> TemplateStagingResult:
    """Stage user and searched templates of every target; write the manifest (and rejects) atomically."""
    if config.search and config.search.max_release_date and not _DATE.match(config.search.max_release_date):
        raise FoldmillError(f"templates.max_release_date must be YYYY-MM-DD, not {config.search.max_release_date!r}")
    targets = load_worklist(worklist_tsv)
    manifest_path = Path(manifest_path)
    staged_dir = (manifest_path.parent / "templates").resolve()
    rows: list[dict[str, object]] = []
    rejects: list[dict[str, str]] = []
    structures: dict[str, TemplateStructure] = {}
    user_chains: dict[str, set[str]] = {}

    for target in targets:
        if not target.templates:
            continue
        unaligned: list[tuple[str, str]] = []
        try:
            staged = user_template_alignments(target, structures, unaligned)
        except InputError as error:
            log.warning("templates of %s rejected: %s", target.target_id, error)
            rejects.append({"target_id": target.target_id, "source": error.source, "problem": str(error)})
            continue
        rejects += [{"target_id": target.target_id, "source": path, "problem": why} for path, why in unaligned]
        for query_chain, alignment, force, threshold in staged:
            path = staged_dir / target.target_id / f"{query_chain}.{alignment.template_id}.npz"
            alignment.save(path)
            rows.append(_row(target.target_id, query_chain, alignment.template_id, path, "user", force, threshold))
        user_chains[target.target_id] = {query_chain for query_chain, *_ in staged}

    searched = 0
    if config.search is not None:
        rejected = {r["target_id"] for r in rejects if r["target_id"] not in user_chains}
        wanted: dict[tuple[str, str], str] = {}  # (target, chain) -> chain hash
        sequences: dict[str, str] = {}  # chain hash -> sequence
        for target in targets:
            if target.target_id in rejected:
                continue
            for entity in target.entities:
                if entity.entity_type != "protein":
                    continue
                for chain_id in entity.chain_ids:
                    if chain_id not in user_chains.get(target.target_id, set()):
                        wanted[(target.target_id, chain_id)] = entity.sequence_hash()
                        sequences[entity.sequence_hash()] = entity.sequence or ""
        cache_root = Path(config.cache_dir or manifest_path.parent / "cache" / "templates").resolve()
        found, searched = _searched_templates(sequences, config.search, cache_root)
        for (target_id, chain_id), chain_hash in wanted.items():
            for template_id, path in found[chain_hash]:
                rows.append(_row(target_id, chain_id, template_id, path, "search", False, None))

    manifest = pd.DataFrame(rows, columns=MANIFEST_COLUMNS)
    reject_table = pd.DataFrame(rejects, columns=REJECT_COLUMNS)
    write_tables({manifest_path: manifest, rejects_path: reject_table})
    log.info(
        "staged %d template alignments (%d chains searched), %d targets rejected",
        len(manifest),
        searched,
        len(reject_table),
    )
    return TemplateStagingResult(manifest, reject_table, searched)


def _row(
    target_id: str, chain_id: str, template_id: str, path: Path, source: str, force: bool, threshold: float | None
):
    return {
        "target_id": target_id, "chain_id": chain_id, "template_id": template_id, "path": str(path),
        "source": source, "force": bool(force), "threshold": "" if threshold is None else threshold,
    }  # fmt: skip


def _searched_templates(
    sequences: dict[str, str], config: TemplateSearchConfig, cache_root: Path
) -> tuple[dict[str, list[tuple[str, Path]]], int]:
    """chain hash -> [(template_id, alignment path)]; chains not cached are searched in one batch."""
    variant = "search-" + hashlib.sha256(config.describe().encode()).hexdigest()[:12]
    folders = {chain_hash: cache_root / chain_hash[:2] / f"{chain_hash}.{variant}" for chain_hash in sequences}
    missing = {h: seq for h, seq in sequences.items() if not (folders[h] / _INDEX).is_file()}
    if missing:
        cache_root.mkdir(parents=True, exist_ok=True)
        workdir = Path(tempfile.mkdtemp(prefix=".search.", dir=cache_root))
        try:
            log.info("searching templates for %d chains against %s", len(missing), config.seqres)
            chosen = search_templates(missing, config, workdir, cache_root)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        for chain_hash, alignments in chosen.items():
            for alignment in alignments:
                alignment.save(folders[chain_hash] / f"{alignment.template_id}.npz")
            index = "".join(f"{a.template_id}\n" for a in alignments)
            write_text_atomic(folders[chain_hash] / _INDEX, index)
    found = {}
    for chain_hash, folder in folders.items():
        ids = (folder / _INDEX).read_text().split()
        found[chain_hash] = [(template_id, folder / f"{template_id}.npz") for template_id in ids]
    return found, len(missing)


def read_template_rejects(path: str | Path) -> pd.DataFrame:
    """A templates_rejects.tsv written by `stage_templates` (all text)."""
    return read_table(path, REJECT_COLUMNS, "template rejects table")
