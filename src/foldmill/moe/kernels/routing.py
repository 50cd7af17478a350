"""Triton dropless routing plan: every (token, slot)'s row in the expert-sorted buffer, in two launches.

experts/routing.py plans in torch with a stable argsort and about thirty small kernels per MoE
layer, the sort alone eight radix passes over 64-bit keys whose values fit in a few bits. Here the
slots are split into chunks: the first launch counts each chunk's slots per expert, the second
places each chunk's slots after the slots of the same expert in earlier chunks (a scan over the
chunk's one-hot rows keeps the token order, as the stable sort does) and marks the buffer's padding
rows. The plan is the torch one, integer for integer.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from foldmill.moe.kernels.grid import cdiv, next_power_of_2


@triton.jit
def _chunk_counts_kernel(index_ptr, chunk_counts_ptr, slots, E_BLOCK: tl.constexpr, CHUNK: tl.constexpr):
    """chunk_counts[chunk, e]: the chunk's slots that chose expert e."""
    chunk = tl.program_id(0)
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    expert = tl.load(index_ptr + offs, mask=offs < slots, other=-1)
    experts = tl.arange(0, E_BLOCK)
    counts = tl.sum((expert[:, None] == experts[None, :]).to(tl.int32), axis=0)
    tl.store(chunk_counts_ptr + chunk * E_BLOCK + experts, counts)


@triton.jit
def _place_kernel(index_ptr, chunk_counts_ptr, counts_ptr, ends_ptr, slot_rows_ptr, source_slots_ptr, slots,
                  capacity, chunks, num_experts, fill_rows, PAD: tl.constexpr, NONEMPTY: tl.constexpr,
                  E_BLOCK: tl.constexpr, CHUNK: tl.constexpr, CHUNKS_BLOCK: tl.constexpr):
    """Each program: its chunk's slots placed in the buffer (slot_rows and source_slots), -1 on the
    padding rows among its `fill_rows` of the buffer, and in program 0 the counts and group ends.
    Every program reduces the whole chunk table itself, so no launch waits for another's totals."""
    chunk = tl.program_id(0)
    experts = tl.arange(0, E_BLOCK)
    real = experts < num_experts
    offs_k = tl.arange(0, CHUNKS_BLOCK)
    table = tl.load(chunk_counts_ptr + offs_k[:, None] * E_BLOCK + experts[None, :], mask=offs_k[:, None] < chunks,
                    other=0)
    counts = tl.sum(table, axis=0)
    earlier = tl.sum(tl.where(offs_k[:, None] < chunk, table, 0), axis=0)
    padded = (counts + PAD - 1) // PAD * PAD
    if NONEMPTY:
        padded = tl.maximum(padded, PAD)
    padded = tl.where(real, padded, 0)
    ends = tl.cumsum(padded, axis=0)
    starts = ends - padded
    if chunk == 0:
        tl.store(counts_ptr + experts, counts.to(tl.int64), mask=real)
        tl.store(ends_ptr + experts, ends, mask=real)

    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    valid = offs < slots
    expert = tl.load(index_ptr + offs, mask=valid, other=-1)
    onehot = (expert[:, None] == experts[None, :]).to(tl.int32)
    before_in_chunk = tl.cumsum(onehot, axis=0) - onehot
    row = tl.sum(onehot * (before_in_chunk + (starts + earlier)[None, :]), axis=1)
    tl.store(slot_rows_ptr + offs, row.to(tl.int64), mask=valid)
    tl.store(source_slots_ptr + row, offs.to(tl.int64), mask=valid)

    # This program's share of the buffer: -1 on each row past its group's slots. Slot rows are
    # never written here, so the two kinds of store need no ordering.
    filled_ends = starts + counts
    for step in range(0, fill_rows, CHUNK):
        rows = chunk * fill_rows + step + tl.arange(0, CHUNK)
        group = tl.sum((ends[None, :] <= rows[:, None]).to(tl.int32), axis=1)
        filled_end = tl.sum(tl.where(experts[None, :] == group[:, None], filled_ends[None, :], 0), axis=1)
        tl.store(source_slots_ptr + rows, tl.full((CHUNK,), -1, tl.int64), mask=(rows < capacity) & (rows >= filled_end))


# Largest (slots x experts) one-hot tile a program holds: 1,024-slot chunks for 8 experts.
_TILE, _WARPS = 8192, 8


def plan_routing_triton(flat: torch.Tensor, num_experts: int, pad_multiple: int, nonempty_groups: bool,
                        capacity: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(slot_rows, source_slots, padded group ends int32, tokens per expert int64) for the flat
    expert index of every slot, as experts/routing.plan_routing makes them; None where the chunk
    table would be too large for one program (the torch plan then runs)."""
    e_block = max(next_power_of_2(num_experts), 2)
    chunk = max(_TILE // e_block, 16)
    slots = flat.numel()
    chunks = cdiv(slots, chunk)
    chunks_block = max(next_power_of_2(chunks), 2)
    if slots == 0 or chunks_block * e_block > _TILE:
        return None
    device = flat.device
    chunk_counts = torch.empty((chunks, e_block), dtype=torch.int32, device=device)
    counts = torch.empty(num_experts, dtype=torch.int64, device=device)
    ends = torch.empty(num_experts, dtype=torch.int32, device=device)
    slot_rows = torch.empty(slots, dtype=torch.int64, device=device)
    source_slots = torch.empty(capacity, dtype=torch.int64, device=device)
    flat = flat.contiguous()
    _chunk_counts_kernel[(chunks,)](flat, chunk_counts, slots, E_BLOCK=e_block, CHUNK=chunk, num_warps=_WARPS)
    fill_rows = cdiv(cdiv(capacity, chunks), chunk) * chunk
    _place_kernel[(chunks,)](flat, chunk_counts, counts, ends, slot_rows, source_slots, slots, capacity, chunks,
                             num_experts, fill_rows, PAD=pad_multiple, NONEMPTY=nonempty_groups, E_BLOCK=e_block,
                             CHUNK=chunk, CHUNKS_BLOCK=chunks_block, num_warps=_WARPS)
    return slot_rows, source_slots, ends, counts
