"""Triton token permute (rows + routing weights in one pass) and unpermute (sum of a token's rows)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from foldmill.moe.kernels.grid import cdiv, next_power_of_2


@triton.jit
def _permute_kernel(
    src_ptr, slots_ptr, probs_ptr, rows_ptr, row_probs_ptr, hidden,
    TOP_K: tl.constexpr, HAS_PROBS: tl.constexpr, BLOCK_H: tl.constexpr,
):
    row, pid_h = tl.program_id(0), tl.program_id(1)
    slot = tl.load(slots_ptr + row)
    valid = slot >= 0
    token = tl.maximum(slot, 0) // TOP_K
    offs = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = offs < hidden
    values = tl.load(src_ptr + token.to(tl.int64) * hidden + offs, mask=mask & valid, other=0.0)
    tl.store(rows_ptr + row.to(tl.int64) * hidden + offs, values, mask=mask)
    if HAS_PROBS:
        if pid_h == 0:
            prob = tl.load(probs_ptr + tl.maximum(slot, 0), mask=valid, other=0.0)
            tl.store(row_probs_ptr + row, prob.to(tl.float32))


@triton.jit
def _sum_rows_kernel(src_ptr, index_ptr, out_ptr, hidden, TOP_K: tl.constexpr, BLOCK_H: tl.constexpr):
    token, pid_h = tl.program_id(0), tl.program_id(1)
    offs = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = offs < hidden
    total = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for k in tl.static_range(TOP_K):
        row = tl.load(index_ptr + token * TOP_K + k)
        total += tl.load(src_ptr + row.to(tl.int64) * hidden + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + token.to(tl.int64) * hidden + offs, total.to(out_ptr.dtype.element_ty), mask=mask)


def _block_h(hidden: int) -> int:
    return min(next_power_of_2(hidden), 1024)


def permute_rows_triton(
    source: torch.Tensor, source_slots: torch.Tensor, top_k: int, probs: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    source = source.contiguous()
    rows_count, hidden = source_slots.shape[0], source.shape[1]
    rows = torch.empty((rows_count, hidden), dtype=source.dtype, device=source.device)
    row_probs = None if probs is None else torch.empty(rows_count, dtype=torch.float32, device=source.device)
    block = _block_h(hidden)
    grid = (rows_count, cdiv(hidden, block))
    flat_probs = probs.reshape(-1).contiguous() if probs is not None else rows
    _permute_kernel[grid](source, source_slots, flat_probs, rows, row_probs if probs is not None else rows, hidden,
                          TOP_K=top_k, HAS_PROBS=probs is not None, BLOCK_H=block, num_warps=4)
    return rows, (row_probs.to(probs.dtype) if probs is not None else None)


def sum_rows_triton(source: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    source, index = source.contiguous(), index.contiguous()
    tokens, top_k = index.shape
    hidden = source.shape[1]
    out = torch.empty((tokens, hidden), dtype=source.dtype, device=source.device)
    block = _block_h(hidden)
    _sum_rows_kernel[(tokens, cdiv(hidden, block))](source, index, out, hidden, TOP_K=top_k, BLOCK_H=block,
                                                    num_warps=4)
    return out
