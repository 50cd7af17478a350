"""Align query chains to template chains (Biopython PairwiseAligner, BLOSUM62).

The residue mapping uses a local alignment with BLAST's protein scoring (gap open -12, extend
-1, as Boltz-2 does); choosing which template chain serves which query chain, when the user
did not say, uses global alignment scores.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from Bio import Align
from Bio.Align import substitution_matrices

from foldmill.templates.structure import TemplateChain, TemplateStructure
from foldmill.templates.types import TemplateAlignment

_ALPHABET = frozenset(substitution_matrices.load("BLOSUM62").alphabet)


@lru_cache(maxsize=2)
def _aligner(mode: str) -> Align.PairwiseAligner:
    aligner = Align.PairwiseAligner(scoring="blastp")
    aligner.mode = mode
    aligner.open_gap_score = -12.0
    aligner.extend_gap_score = -1.0
    return aligner


def _clean(sequence: str) -> str:
    """Letters outside BLOSUM62's alphabet (U, O, ...) scored as X."""
    return "".join(letter if letter in _ALPHABET else "X" for letter in sequence.upper())


def global_score(query: str, template: str) -> float:
    return float(_aligner("global").score(_clean(query), _clean(template)))


def residue_mapping(query: str, template: str) -> tuple[np.ndarray, np.ndarray]:
    """Aligned (query position, template position) pairs, 0-based, of the best local alignment."""
    alignments = _aligner("local").align(_clean(query), _clean(template))
    try:
        best = alignments[0]
    except IndexError:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    query_blocks, template_blocks = best.aligned
    query_index = [np.arange(start, end) for start, end in query_blocks]
    template_index = [np.arange(start, end) for start, end in template_blocks]
    if not query_index:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(query_index).astype(np.int64), np.concatenate(template_index).astype(np.int64)


def align_template(query: str, structure: TemplateStructure, chain: TemplateChain) -> TemplateAlignment:
    """The TemplateAlignment of `query` onto one chain of a template structure (may be empty)."""
    query_index, template_index = residue_mapping(query, chain.sequence)
    return TemplateAlignment(
        template_id=f"{structure.structure_id}_{chain.chain_id}",
        source=structure.path,
        template_chain_id=chain.chain_id,
        release_date=structure.release_date,
        query_index=query_index,
        template_index=template_index,
        template_residue_names=np.array([chain.residue_names[i] for i in template_index], dtype=str),
        coords=chain.coords[template_index],
        atom_mask=chain.atom_mask[template_index],
    )


def assign_chains(queries: dict[str, str], templates: dict[str, str]) -> list[tuple[str, str]]:
    """Pair query chains with distinct template chains, best global alignment score first.

    queries/templates map chain id -> sequence. Extra query chains (more query than template
    chains) get no template.
    """
    scored = sorted(
        (
            (global_score(q_seq, t_seq), q_id, t_id)
            for q_id, q_seq in queries.items()
            for t_id, t_seq in templates.items()
        ),
        key=lambda item: -item[0],
    )
    taken_queries: set[str] = set()
    taken_templates: set[str] = set()
    pairs = []
    for _, q_id, t_id in scored:
        if q_id not in taken_queries and t_id not in taken_templates:
            pairs.append((q_id, t_id))
            taken_queries.add(q_id)
            taken_templates.add(t_id)
    order = list(queries)
    return sorted(pairs, key=lambda pair: order.index(pair[0]))
