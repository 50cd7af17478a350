"""MSA features of a complex: per-chain MSAs paired into one row plan, then gathered per token.

The row plan follows OSS Boltz-2 (boltz-community 2.13), which is what the checkpoint was
trained and evaluated with:
1. row 0 holds every chain's query;
2. for each pairing key found in more than one row of any chains (keys shared by more chains
   first; ties in order of first appearance, chain by chain), as many rows as the key's largest
   per-chain count: chains with the key contribute their i-th hit (cycling when they have
   fewer), every other chain its next unused row (a gap once exhausted); at most 8192 such rows;
3. then the remaining rows of every chain side by side, up to 16384 rows in total.
Rows with a shared key are never reused as unpaired rows. Chains without an MSA (single-sequence
proteins, nucleic acids, ligands) have only their query row; `msa_paired` marks key-paired cells.

Deletion features are computed from the MSAs' insertion counts. OSS zeroes them (its loop over
rows overwrites the array it slices from, featurizerv2.py ~line 433); this is an intentional
difference, checked against OSS with that slicing corrected.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from foldmill.features.tokenize import Tokenized
from foldmill.msa.types import MSA
from foldmill.vocab import GAP_ID, NUM_TOKENS, token_id

MAX_PAIRED_ROWS = 8192
MAX_ROWS = 16384
GAP_ROW = -1


def _lookup_table(entity_type: str) -> np.ndarray:
    table = np.full(256, token_id(entity_type, "X"), dtype=np.int64)
    for code in range(ord("A"), ord("Z") + 1):
        table[code] = token_id(entity_type, chr(code))
    table[ord("-")] = GAP_ID
    return table


_TABLES = {kind: _lookup_table(kind) for kind in ("protein", "dna", "rna")}


def token_ids(residues: np.ndarray, entity_type: str) -> np.ndarray:
    """Vocabulary classes (int64, same shape) of ASCII MSA residues of a `entity_type` chain: '-' is the
    gap class; unknown letters are UNK / N / DN."""
    return _TABLES[entity_type][residues]


@dataclass
class ChainMSA:
    """One chain's MSA in vocabulary classes; row 0 is the chain's own residue classes."""

    classes: np.ndarray  # (depth, n_residues) int64
    deletions: np.ndarray  # (depth, n_residues) int64
    keys: np.ndarray  # (depth,) str, "" = no pairing key


def chain_msa(residue_classes: np.ndarray, msa: MSA | None) -> ChainMSA:
    """The ChainMSA of a chain whose residue table holds `residue_classes`; query row only if no MSA."""
    if msa is None:
        query = residue_classes[None].astype(np.int64)
        return ChainMSA(query, np.zeros_like(query), np.array([""]))
    classes = token_ids(msa.residues, "protein")
    # The query row is the chain as featurized (modified residues count as UNK, as in OSS).
    classes[0] = residue_classes
    keys = msa.keys.astype(str)
    return ChainMSA(classes, msa.deletions.astype(np.int64), keys)


def pair_rows(msas: list[ChainMSA]) -> tuple[np.ndarray, np.ndarray]:
    """The OSS row plan: rows (n_rows, n_chains) into each chain's MSA (-1 = gap) and is_paired."""
    groups: dict[str, list[tuple[int, int]]] = {}
    for chain, msa in enumerate(msas):
        for row in np.flatnonzero(msa.keys != "").tolist():
            groups.setdefault(str(msa.keys[row]), []).append((chain, row))
    shared = [hits for hits in groups.values() if len(hits) > 1]
    shared.sort(key=lambda hits: len({chain for chain, _ in hits}), reverse=True)  # stable
    used = {hit for hits in shared for hit in hits}
    available = [deque(r for r in range(1, len(m.classes)) if (c, r) not in used) for c, m in enumerate(msas)]

    def next_unpaired(chain: int) -> int:
        return available[chain].popleft() if available[chain] else GAP_ROW

    n_chains = len(msas)
    plan = [[0] * n_chains]
    paired = [[1] * n_chains]
    for hits in shared:
        per_chain: dict[int, list[int]] = {}
        for chain, row in hits:
            per_chain.setdefault(chain, []).append(row)
        for i in range(max(len(rows) for rows in per_chain.values())):
            row = [per_chain[c][i % len(per_chain[c])] if c in per_chain else next_unpaired(c) for c in range(n_chains)]
            plan.append(row)
            paired.append([int(c in per_chain) for c in range(n_chains)])
            if len(plan) >= MAX_PAIRED_ROWS:
                break
        if len(plan) >= MAX_PAIRED_ROWS:
            break
    for _ in range(min(MAX_ROWS - len(plan), max(len(queue) for queue in available))):
        plan.append([next_unpaired(c) for c in range(n_chains)])
        paired.append([0] * n_chains)
    return np.array(plan, dtype=np.int64)[:MAX_ROWS], np.array(paired, dtype=np.int64)[:MAX_ROWS]


def msa_features(tokenized: Tokenized, msas: list[ChainMSA]) -> dict[str, torch.Tensor]:
    """Boltz-2 MSA features; `msas` holds one ChainMSA per chain in asym order."""
    rows, paired = pair_rows(msas)
    tokens = tokenized.tokens
    n_rows, n_tokens = rows.shape[0], len(tokens)
    # Built token-major and transposed, like OSS: the memory layout decides the float summation
    # order of deletion_mean, and with it the last bit.
    classes = np.full((n_tokens, n_rows), GAP_ID, dtype=np.int64)
    deletions = np.zeros((n_tokens, n_rows), dtype=np.float32)  # small counts: exact in float32
    is_paired = np.zeros((n_tokens, n_rows), dtype=np.float32)
    for chain, msa in enumerate(msas):
        on_chain = np.flatnonzero(tokens.asym_id == chain)
        chain_rows = rows[:, chain]
        present = np.flatnonzero(chain_rows != GAP_ROW)
        columns = tokens.residue_index[on_chain][:, None]
        picked = chain_rows[present][None, :]
        classes[np.ix_(on_chain, present)] = msa.classes[picked, columns]
        deletions[np.ix_(on_chain, present)] = msa.deletions[picked, columns]
        is_paired[on_chain, :] = paired[:, chain][None, :]

    msa = torch.from_numpy(classes).T
    deletion = torch.from_numpy(deletions).T
    counts = torch.zeros(n_tokens, NUM_TOKENS, dtype=torch.float32)
    counts.scatter_add_(1, msa.T, torch.ones(n_tokens, n_rows))
    # Same float32 operations as OSS, so values match bit for bit.
    deletion_value = np.pi / 2 * torch.from_numpy(np.arctan((deletion / 3).numpy()))
    return {
        "msa": msa,
        "msa_paired": torch.from_numpy(is_paired).T,
        "deletion_value": deletion_value,
        "has_deletion": deletion > 0,
        "deletion_mean": deletion_value.mean(dim=0),
        "profile": counts / n_rows,
        "msa_mask": torch.ones_like(msa),
    }
