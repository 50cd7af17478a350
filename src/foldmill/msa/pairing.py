"""Pair the per-chain MSAs of a complex into one MSA (rows across chains).

`pair_msas(msas)` plans which row of each chain's MSA goes into each row of the complex MSA.
The plan is the one OSS Boltz-2 (boltz-community 2.13) builds at inference, which is what the
released checkpoint saw, with its repeated-row bug fixed:

1. Row 0 holds every chain's query (marked paired).
2. Paired block. Rows with the same non-empty pairing key (`MSA.keys`: same organism, or the
   row index of a pre-paired ColabFold/Boltz CSV MSA) form a group when the key occurs in more
   than one row of any chains. Groups spanning more chains come first (ties: order of first
   appearance, chain by chain, best rows first). A group gives as many rows as its largest
   per-chain count: each chain holding the key contributes its i-th row of the key (cycling
   through them when it has fewer; marked paired), every other chain its next unused row
   (marked unpaired), or a gap once it has none left. At most `max_paired` rows (query
   included).
3. Unpaired block: the rows no group holds and no fill used, each chain's in its original
   order, side by side (row r holds each chain's r-th remaining row, a gap once it runs out).
   A row belonging to a group never appears here (OSS Boltz 2.2.1 added paired rows again).
4. The plan is cut to `max_depth` rows (OSS: 16384 at inference; the per-chain MSAs are
   capped at `msa.max_depth`, 8192, when staged).

Only each MSA's `keys` (and depth) are read. Identical chains (homo-oligomers) pass the same MSA
for each copy; their shared keys pair row i with row i.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from foldmill.msa.types import MSA

MAX_PAIRED_ROWS = 8192  # OSS const.max_paired_seqs
MAX_ROWS = 16384  # OSS const.max_msa_seqs, the complex MSA depth at inference
GAP_ROW = -1


@dataclass(frozen=True)
class PairedRows:
    """The row plan of a complex MSA.

    rows[r, c]      row of msas[c] placed in complex-MSA row r; -1 = a gap row for chain c
    is_paired[r, c] True where chain c's row was placed by its pairing key (and in row 0)
    n_paired        rows[:n_paired] are the query row and the paired block,
                    rows[n_paired:] the unpaired block
    """

    rows: np.ndarray  # (depth, n_chains) int64
    is_paired: np.ndarray  # (depth, n_chains) bool
    n_paired: int

    @property
    def depth(self) -> int:
        return int(self.rows.shape[0])


def pair_msas(msas: list[MSA], max_depth: int = MAX_ROWS, max_paired: int = MAX_PAIRED_ROWS) -> PairedRows:
    """Plan the complex MSA of `msas` (one per chain, in chain order); see the module docstring."""
    if not msas:
        raise ValueError("pair_msas needs at least one MSA")
    if max_depth < 1 or max_paired < 1:
        raise ValueError("max_depth and max_paired must be at least 1")
    n_chains = len(msas)
    groups = _key_groups(msas)
    grouped = {(chain, row) for group in groups for chain, rows in group.items() for row in rows}
    available = [deque(r for r in range(1, msa.depth) if (c, r) not in grouped) for c, msa in enumerate(msas)]

    def next_unused(chain: int) -> int:
        return available[chain].popleft() if available[chain] else GAP_ROW

    plan: list[list[int]] = [[0] * n_chains]
    paired: list[list[bool]] = [[True] * n_chains]
    for group in groups:
        for i in range(max(len(rows) for rows in group.values())):
            if len(plan) >= max_paired:
                break
            plan.append([group[c][i % len(group[c])] if c in group else next_unused(c) for c in range(n_chains)])
            paired.append([c in group for c in range(n_chains)])
    n_paired = len(plan)

    for _ in range(min(max_depth - n_paired, max((len(queue) for queue in available), default=0))):
        plan.append([next_unused(c) for c in range(n_chains)])
        paired.append([False] * n_chains)

    rows = np.array(plan[:max_depth], dtype=np.int64).reshape(-1, n_chains)
    is_paired = np.array(paired[:max_depth], dtype=bool).reshape(-1, n_chains)
    return PairedRows(rows, is_paired, min(n_paired, max_depth))


def _key_groups(msas: list[MSA]) -> list[dict[int, list[int]]]:
    """Rows per chain of each key found in more than one row, widest groups first (stable)."""
    groups: dict[str, dict[int, list[int]]] = {}
    counts: dict[str, int] = {}
    for chain, msa in enumerate(msas):
        for row in np.flatnonzero(msa.keys != "").tolist():
            key = str(msa.keys[row])
            groups.setdefault(key, {}).setdefault(chain, []).append(row)
            counts[key] = counts.get(key, 0) + 1
    shared = [group for key, group in groups.items() if counts[key] > 1]
    shared.sort(key=len, reverse=True)
    return shared


def paired_msa_arrays(msas: list[MSA], plan: PairedRows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The complex MSA of `plan`, chains side by side (columns = the chains' residues in order).

    Returns residues (depth, sum of lengths) uint8 ASCII with '-' in gap rows, deletions
    (depth, sum of lengths) int32 (0 in gap rows), and is_paired (depth, sum of lengths) bool.
    """
    residues, deletions, paired = [], [], []
    for chain, msa in enumerate(msas):
        index = plan.rows[:, chain]
        gap = index == GAP_ROW
        safe = np.where(gap, 0, index)
        residues.append(np.where(gap[:, None], np.uint8(ord("-")), msa.residues[safe]))
        deletions.append(np.where(gap[:, None], np.int32(0), msa.deletions[safe]))
        paired.append(np.repeat(plan.is_paired[:, chain : chain + 1], msa.length, axis=1))
    return (
        np.concatenate(residues, axis=1).astype(np.uint8),
        np.concatenate(deletions, axis=1).astype(np.int32),
        np.concatenate(paired, axis=1),
    )
