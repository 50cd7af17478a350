"""MSA letters -> Boltz-2 vocabulary classes (`foldmill.features.vocab`), per polymer type.

'-' is the gap class; unknown letters are UNK / N / DN. The MSA features built from these
classes (profile, deletion values) live in `foldmill.features.msa_features`.
"""

from __future__ import annotations

import numpy as np

from foldmill.features.vocab import GAP_ID, token_id


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
