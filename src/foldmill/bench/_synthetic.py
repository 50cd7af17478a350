"""Synthetic proteins and MSAs for benchmarks (numpy only, so bare GPU nodes can import it)."""

from __future__ import annotations

import numpy as np

AMINO_ACIDS = np.array(list("ACDEFGHIKLMNPQRSTVWY"))
# UniProtKB/Swiss-Prot amino-acid composition (same order), so sequences look like proteins.
AMINO_ACID_FREQUENCIES = np.array(
    [8.25, 1.38, 5.46, 6.72, 3.86, 7.07, 2.27, 5.91, 5.80, 9.64, 2.41, 4.06, 4.74, 3.93, 5.53, 6.65, 5.36, 6.86, 1.10, 2.92]
)
AMINO_ACID_FREQUENCIES = AMINO_ACID_FREQUENCIES / AMINO_ACID_FREQUENCIES.sum()
_LETTERS = np.frombuffer("".join(AMINO_ACIDS).encode("ascii"), dtype=np.uint8)
_CUMULATIVE = AMINO_ACID_FREQUENCIES.cumsum() / AMINO_ACID_FREQUENCIES.cumsum()[-1]


def random_protein(length: int, rng: np.random.Generator) -> str:
    """A sequence of Swiss-Prot composition: the draw of `rng.choice(AMINO_ACIDS, length, p=...)`, the same
    letters from the same random stream, without its per-letter strings (20,000 targets in 0.2 s, not 5 s)."""
    return _LETTERS[_CUMULATIVE.searchsorted(rng.random(length), side="right")].tobytes().decode("ascii")


def synthetic_msa(query: str, depth: int, rng: np.random.Generator) -> str:
    """A3M text: the query, then depth-1 homologs at 30-90% identity with gaps and insertions."""
    rows = np.tile(np.array(list(query)), (depth - 1, 1))
    identity = rng.uniform(0.3, 0.9, size=(depth - 1, 1))
    mutate = rng.random(rows.shape) > identity
    rows[mutate] = rng.choice(AMINO_ACIDS, size=int(mutate.sum()), p=AMINO_ACID_FREQUENCIES)
    rows[rng.random(rows.shape) < 0.05] = "-"
    lines = [">query", query]
    inserts = rng.random(rows.shape) < 0.02
    for number, (row, insert_at) in enumerate(zip(rows, inserts), start=1):
        text = "".join(row)
        for position in np.flatnonzero(insert_at)[::-1]:  # lowercase = insertion relative to the query
            text = text[: position + 1] + AMINO_ACIDS[rng.integers(20)].lower() + text[position + 1 :]
        lines += [f">homolog_{number}", text]
    return "\n".join(lines) + "\n"
