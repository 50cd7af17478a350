"""Pair computations by blocks of token rows: bounded temporaries at any token count.

Many pair operations act on each token pair (i, j) alone (projections, transitions, embeddings,
per-pair softmax over bins). Running them a block of rows i at a time and writing each block into
one output allocated once keeps their temporaries to a block's size: at 6,000 tokens a single
(T, T, 128) bf16 tensor is 8.6 GiB, and an unblocked chain of such ops holds several at once.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

# Token pairs per block: a block's temporaries stay below ~1 GiB (the widest, a 256-channel fp32
# concatenation, is 0.5 GiB); below ~700 tokens there is a single block (the unblocked computation).
PAIRS_PER_BLOCK = 1 << 19


def rows_per_block(pairs_per_row: int, pairs_per_block: int | None = None) -> int:
    """Rows of `pairs_per_row` pairs (usually the token count) per block of at most `pairs_per_block`
    pairs (PAIRS_PER_BLOCK when None), at least one."""
    return max(1, (pairs_per_block or PAIRS_PER_BLOCK) // max(pairs_per_row, 1))


def by_token_rows(pair_fn: Callable[[slice], Tensor], tokens: int, rows: int) -> Tensor:
    """pair_fn(rows slice) -> its (B, rows, ...) block of a result, assembled block by block into one
    (B, tokens, ...) tensor allocated once in the blocks' dtype (a single block is returned as is)."""
    first = pair_fn(slice(0, rows))
    if rows >= tokens:
        return first
    out = first.new_empty((first.shape[0], tokens, *first.shape[2:]))
    out[:, :rows] = first
    del first
    for start in range(rows, tokens, rows):
        out[:, start : start + rows] = pair_fn(slice(start, start + rows))
    return out
