"""MSA-derived per-residue features in Boltz-2's conventions.

token_ids       MSA letters -> Boltz-2 vocabulary classes (`foldmill.features.vocab`), per
                polymer type ('-' is the gap class; unknown letters are UNK / N / DN)
profile         (L, 33) fraction of rows with each class at each column (gaps included)
deletion_value  pi/2 * arctan(d/3), the transform the released Boltz-2 checkpoint was trained
                with (AlphaFold 2 uses 2/pi; keep Boltz's for checkpoint compatibility)
has_deletion    d > 0
deletion_mean   (L,) mean deletion_value over rows

Deletion counts come from the staged MSA itself. OSS Boltz (2.2.1 and boltz-community 2.13)
loses them in its featurizer (`chain_deletions` is overwritten while looping over rows, so all
rows after the first read an empty slice); these functions compute them for every row.
"""

from __future__ import annotations

import numpy as np

from foldmill.features.vocab import GAP_ID, NUM_TOKENS, token_id


def _lookup_table(entity_type: str) -> np.ndarray:
    table = np.full(256, token_id(entity_type, "X"), dtype=np.int64)
    for code in range(ord("A"), ord("Z") + 1):
        table[code] = token_id(entity_type, chr(code))
    table[ord("-")] = GAP_ID
    return table


_TABLES = {kind: _lookup_table(kind) for kind in ("protein", "dna", "rna")}


def token_ids(residues: np.ndarray, entity_type: str) -> np.ndarray:
    """Vocabulary classes (int64, same shape) of ASCII MSA residues of a `entity_type` chain."""
    return _TABLES[entity_type][residues]


def profile(ids: np.ndarray) -> np.ndarray:
    """(L, NUM_TOKENS) float32: per column, the fraction of rows holding each class."""
    depth, length = ids.shape
    counts = np.zeros((length, NUM_TOKENS), dtype=np.float64)
    np.add.at(counts, (np.broadcast_to(np.arange(length), ids.shape), ids), 1.0)
    return (counts / depth).astype(np.float32)


def deletion_value(deletions: np.ndarray) -> np.ndarray:
    return (np.pi / 2 * np.arctan(deletions / 3.0)).astype(np.float32)


def has_deletion(deletions: np.ndarray) -> np.ndarray:
    return deletions > 0


def deletion_mean(deletions: np.ndarray) -> np.ndarray:
    """(L,) float32 mean of deletion_value over the rows."""
    return deletion_value(deletions).mean(axis=0).astype(np.float32)
