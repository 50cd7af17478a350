"""Template search: MMseqs2 against a PDB seqres FASTA, structures read from an mmCIF directory.

The seqres FASTA names each chain `<structure id>_<chain id>` (the PDB's pdb_seqres.txt layout:
">101m_A mol:protein length:154  MYOGLOBIN"); `write_seqres` builds one from a directory of
structures. Hits are taken best first; a hit is kept when its structure file is found in the
mmCIF directory (<dir>/<id>.cif[.gz], either case, or the PDB mirror layout
<dir>/<middle two characters>/<id>.cif[.gz]), it was released on or before the date limit (a
structure without a release date is skipped when a limit is set), and it aligns to the query;
the first `top_k` distinct template chains are kept.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from foldmill.errors import InputError
from foldmill.io.atomic import atomic_path
from foldmill.msa import mmseqs
from foldmill.templates.align import align_template
from foldmill.templates.structure import STRUCTURE_SUFFIXES, TemplateStructure, read_template
from foldmill.templates.types import TemplateAlignment

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TemplateSearchConfig:
    seqres: str  # FASTA of template chain sequences, or an MMseqs2 database of it
    mmcif_dir: str
    max_release_date: str = ""  # YYYY-MM-DD; "" = no limit
    top_k: int = 4
    search: mmseqs.SearchSettings = mmseqs.SearchSettings(
        sensitivity=7.5, evalue=1e-3, max_seqs=1000, diversity_filter=False
    )

    def describe(self) -> str:
        return (
            f"{mmseqs.file_signature(self.seqres)}|{Path(self.mmcif_dir).resolve()}|date<={self.max_release_date}"
            f"|top_k={self.top_k}|{self.search.describe()}"
        )


def write_seqres(structure_files: Iterable[str | Path], fasta: str | Path) -> int:
    """Write the protein chains of `structure_files` as a seqres FASTA; returns the chain count."""
    records = []
    for path in structure_files:
        structure = read_template(path)
        for chain in structure.chains.values():
            header = f"{structure.structure_id}_{chain.chain_id} mol:protein length:{len(chain.sequence)}"
            records.append(f">{header}\n{chain.sequence}\n")
    with atomic_path(fasta) as tmp:
        tmp.write_text("".join(records))
    return len(records)


def structure_files(directory: str | Path) -> list[Path]:
    return sorted(p for p in Path(directory).iterdir() if p.name.lower().endswith(STRUCTURE_SUFFIXES))


def find_structure(mmcif_dir: str | Path, structure_id: str) -> Path | None:
    root = Path(mmcif_dir)
    for name in dict.fromkeys((structure_id, structure_id.lower(), structure_id.upper())):
        for folder in (root, root / name[1:3]):
            for suffix in (".cif", ".cif.gz"):
                candidate = folder / f"{name}{suffix}"
                if candidate.is_file():
                    return candidate
    return None


def split_hit_name(name: str) -> tuple[str, str]:
    """'1aki_A' -> ('1aki', 'A')."""
    structure_id, _, chain_id = name.rpartition("_")
    return (structure_id, chain_id) if structure_id else (name, "")


class TemplateSelector:
    """Turns ranked search hits into at most top_k aligned templates per query."""

    def __init__(self, config: TemplateSearchConfig) -> None:
        self.config = config
        self._structures: dict[str, TemplateStructure | None] = {}

    def structure(self, structure_id: str) -> TemplateStructure | None:
        if structure_id not in self._structures:
            path = find_structure(self.config.mmcif_dir, structure_id)
            parsed = None
            if path is None:
                log.warning("template %s: no structure file in %s", structure_id, self.config.mmcif_dir)
            else:
                try:
                    parsed = read_template(path)
                except InputError as error:
                    log.warning("template %s skipped: %s", structure_id, error)
            self._structures[structure_id] = parsed
        return self._structures[structure_id]

    def select(self, query: str, hits: list[mmseqs.Hit]) -> list[TemplateAlignment]:
        chosen: list[TemplateAlignment] = []
        seen: set[str] = set()
        limit = self.config.max_release_date
        for hit in hits:
            if len(chosen) >= self.config.top_k:
                break
            if hit.target in seen:
                continue
            seen.add(hit.target)
            structure_id, chain_id = split_hit_name(hit.target)
            structure = self.structure(structure_id)
            if structure is None or chain_id not in structure.chains:
                continue
            if limit and (not structure.release_date or structure.release_date > limit):
                log.debug("template %s released %s, after %s", hit.target, structure.release_date or "?", limit)
                continue
            alignment = align_template(query, structure, structure.chains[chain_id])
            if len(alignment):
                chosen.append(alignment)
        return chosen


def search_templates(
    queries: dict[str, str], config: TemplateSearchConfig, workdir: Path, cache_dir: Path
) -> dict[str, list[TemplateAlignment]]:
    """One batched search of all `queries` (id -> protein sequence); the chosen templates per id."""
    database = mmseqs.target_database(config.seqres, cache_dir)
    hits = mmseqs.search(queries, database, workdir, config.search)
    selector = TemplateSelector(config)
    return {name: selector.select(sequence, hits[name]) for name, sequence in queries.items()}
