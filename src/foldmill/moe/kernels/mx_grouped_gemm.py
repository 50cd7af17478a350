"""Triton grouped GEMM on MXFP8 operands (E4M3 elements, one E8M0 scale per 32 along the contraction).

Hopper has no tensor-core instruction that applies per-32 block scales, so each 32-wide block of
the contraction is one FP8 MMA (fp32 result), multiplied by the product of the two operands' block
scales and added to an fp32 accumulator ("promotion" after every block). `MMA_MODE`:
  "fp8"    FP8 MMAs per block, scales applied while accumulating (sm90; the default)
  "bf16"   dequantize each tile into bf16 in registers, then bf16 MMAs (a comparison point)
  "scaled" tl.dot_scaled: the native block-scaled MMA on Blackwell (sm100)
Two kernels share the inner loop:
  forward/dgrad  out (rows, N) = a_e b_e^T, a (rows, K), b (experts, N, K); groups split the rows
  wgrad          out (experts, N, K) = a[:, g] b[:, g]^T, a (N, rows), b (K, rows); groups split
                 the contraction, so their boundaries must be multiples of 32
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from foldmill.moe.kernels import compute_capability
from foldmill.moe.kernels.mx_quant import scale_factor
from foldmill.moe.quant.mx import BLOCK, MXTensor


@triton.jit
def _scaled_block_dot(
    acc, a_ptr, sa_ptr, a_rows, a_mask, lda, sa_stride,
    b_ptr, sb_ptr, b_rows, b_mask, ldb, sb_stride,
    block_start, block_stop, MMA_MODE: tl.constexpr, BLOCKS_PER_STEP: tl.constexpr,
):
    """acc += sum over 32-blocks kb in [block_start, block_stop) of
    (sa[kb, a_rows] * sb[kb, b_rows]) * a[a_rows, kb*32:+32] @ b[b_rows, kb*32:+32]^T.

    Scales are stored block-major (kb, row) so each step reads them contiguously.
    """
    offs_k = tl.arange(0, 32)
    a_base = a_ptr + a_rows[:, None].to(tl.int64) * lda + offs_k[None, :]
    b_base = b_ptr + b_rows[None, :].to(tl.int64) * ldb + offs_k[:, None]
    for step in range(block_start, block_stop, BLOCKS_PER_STEP):
        if MMA_MODE == "bf16":
            # One wide bf16 MMA per step over BLOCKS_PER_STEP dequantized blocks.
            offs_w = tl.arange(0, 32 * BLOCKS_PER_STEP)
            k_ok = step * 32 + offs_w < block_stop * 32
            a = tl.load(a_ptr + a_rows[:, None].to(tl.int64) * lda + (step * 32 + offs_w)[None, :],
                        mask=a_mask[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(b_ptr + b_rows[None, :].to(tl.int64) * ldb + (step * 32 + offs_w)[:, None],
                        mask=b_mask[None, :] & k_ok[:, None], other=0.0)
            offs_kb = step + tl.arange(0, BLOCKS_PER_STEP)
            kb_ok = offs_kb < block_stop
            sa = tl.load(sa_ptr + offs_kb[None, :] * sa_stride + a_rows[:, None], mask=a_mask[:, None] & kb_ok[None, :],
                         other=127)
            sb = tl.load(sb_ptr + offs_kb[:, None] * sb_stride + b_rows[None, :], mask=b_mask[None, :] & kb_ok[:, None],
                         other=127)
            a32 = tl.reshape(a.to(tl.float32), (a.shape[0], BLOCKS_PER_STEP, 32)) * scale_factor(sa)[:, :, None]
            b32 = tl.reshape(b.to(tl.float32), (BLOCKS_PER_STEP, 32, b.shape[1])) * scale_factor(sb)[:, None, :]
            a16 = tl.reshape(a32, (a.shape[0], 32 * BLOCKS_PER_STEP)).to(tl.bfloat16)
            b16 = tl.reshape(b32, (32 * BLOCKS_PER_STEP, b.shape[1])).to(tl.bfloat16)
            acc = tl.dot(a16, b16, acc)
        else:
            for j in tl.static_range(BLOCKS_PER_STEP):
                kb = step + j
                ok = kb < block_stop
                a = tl.load(a_base + kb * 32, mask=a_mask[:, None] & ok, other=0.0)
                b = tl.load(b_base + kb * 32, mask=b_mask[None, :] & ok, other=0.0)
                sa = tl.load(sa_ptr + kb * sa_stride + a_rows, mask=a_mask & ok, other=127)
                sb = tl.load(sb_ptr + kb * sb_stride + b_rows, mask=b_mask & ok, other=127)
                if MMA_MODE == "fp8":
                    partial = tl.dot(a, b)
                    acc += partial * (scale_factor(sa)[:, None] * scale_factor(sb)[None, :])
                else:
                    acc = tl.dot_scaled(a, sa[:, None], "e4m3", b, sb[:, None], "e4m3", acc=acc)
    return acc


def _configs() -> list[triton.Config]:
    shapes = [(128, 128, 8, 4), (128, 256, 8, 3), (64, 128, 4, 4), (128, 128, 4, 3)]
    return [
        triton.Config({"BLOCK_M": m, "BLOCK_N": n, "GROUP_M": 8, "BLOCKS_PER_STEP": 4}, num_warps=w, num_stages=s)
        for m, n, w, s in shapes
    ]


@triton.autotune(configs=_configs(), key=["N", "K", "MMA_MODE"])
@triton.jit
def _grouped_forward_kernel(
    a_ptr, sa_ptr, b_ptr, sb_ptr, out_ptr, ends_ptr, rows_total, N, K, num_experts,
    MMA_MODE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr,
    BLOCKS_PER_STEP: tl.constexpr,
):
    pid = tl.program_id(0)
    num_n_tiles = tl.cdiv(N, BLOCK_N)
    # Padded groups need at most one partial tile each beyond rows_total / BLOCK_M.
    max_m_tiles = tl.cdiv(rows_total, BLOCK_M) + num_experts
    # Super-grouping of M tiles keeps the weights of one expert in L2 across neighbouring programs.
    per_group = GROUP_M * num_n_tiles
    first_m = (pid // per_group) * GROUP_M
    group_size = tl.minimum(max_m_tiles - first_m, GROUP_M)
    tile_m = first_m + (pid % per_group) % group_size
    tile_n = (pid % per_group) // group_size
    # Find the expert owning the tile_m-th M tile (tiles never straddle groups).
    expert, row_start, row_stop = -1, 0, 0
    remaining, group_start = tile_m, 0
    for e in range(0, num_experts):
        group_stop = tl.load(ends_ptr + e)
        tiles = tl.cdiv(group_stop - group_start, BLOCK_M)
        hit = (remaining >= 0) & (remaining < tiles)
        expert = tl.where(hit, e, expert)
        row_start = tl.where(hit, group_start + remaining * BLOCK_M, row_start)
        row_stop = tl.where(hit, group_stop, row_stop)
        remaining -= tiles
        group_start = group_stop
    if expert >= 0:
        rows = row_start + tl.arange(0, BLOCK_M)
        cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
        row_mask, col_mask = rows < row_stop, cols < N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        # b's scales are (experts, K / 32, N): offset this expert's slab, then index by column.
        acc = _scaled_block_dot(acc, a_ptr, sa_ptr, rows, row_mask, K, rows_total,
                                b_ptr + expert.to(tl.int64) * N * K, sb_ptr + expert.to(tl.int64) * N * (K // 32),
                                cols, col_mask, K, N, 0, K // 32, MMA_MODE, BLOCKS_PER_STEP)
        out_ptrs = out_ptr + rows[:, None].to(tl.int64) * N + cols[None, :]
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & col_mask[None, :])


@triton.autotune(configs=_configs(), key=["N", "K", "MMA_MODE"])
@triton.jit
def _grouped_wgrad_kernel(
    a_ptr, sa_ptr, b_ptr, sb_ptr, out_ptr, ends_ptr, N, K, rows_total,
    MMA_MODE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr,
    BLOCKS_PER_STEP: tl.constexpr,
):
    # Output tile (BLOCK_M over N) x (BLOCK_N over K) of expert program_id(1).
    pid, expert = tl.program_id(0), tl.program_id(1)
    num_m_tiles, num_n_tiles = tl.cdiv(N, BLOCK_M), tl.cdiv(K, BLOCK_N)
    per_group = GROUP_M * num_n_tiles
    first_m = (pid // per_group) * GROUP_M
    group_size = tl.minimum(num_m_tiles - first_m, GROUP_M)
    tile_m = first_m + (pid % per_group) % group_size
    tile_n = (pid % per_group) // group_size
    group_start = tl.where(expert > 0, tl.load(ends_ptr + expert - 1, mask=expert > 0, other=0), 0)
    group_stop = tl.load(ends_ptr + expert)
    rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask, col_mask = rows < N, cols < K
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc = _scaled_block_dot(acc, a_ptr, sa_ptr, rows, row_mask, rows_total, N,
                            b_ptr, sb_ptr, cols, col_mask, rows_total, K,
                            group_start // 32, group_stop // 32, MMA_MODE, BLOCKS_PER_STEP)
    out_ptrs = out_ptr + expert.to(tl.int64) * N * K + rows[:, None].to(tl.int64) * K + cols[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & col_mask[None, :])


def block_major(scale: torch.Tensor) -> torch.Tensor:
    """(..., rows, blocks) scales -> (..., blocks, rows) contiguous, so a K step reads one run of bytes."""
    return scale.transpose(-2, -1).contiguous()


def mma_mode(tensor: torch.Tensor) -> str:
    """'scaled' on Blackwell, else 'fp8'; FOLDMILL_MX_MMA overrides (fp8, bf16, scaled) for benchmarks."""
    forced = os.environ.get("FOLDMILL_MX_MMA")
    if forced:
        return forced
    return "scaled" if compute_capability(tensor)[0] >= 10 else "fp8"


def mx_grouped_mm_triton(a: MXTensor, b: MXTensor, ends: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    rows, k = a.shape
    experts, n, _ = b.shape
    if k % BLOCK:
        raise ValueError(f"contraction size {k} is not a multiple of {BLOCK}")
    out = torch.empty((rows, n), dtype=out_dtype, device=a.data.device)

    def grid(meta):
        max_m_tiles = triton.cdiv(rows, meta["BLOCK_M"]) + experts
        return (max_m_tiles * triton.cdiv(n, meta["BLOCK_N"]),)

    _grouped_forward_kernel[grid](
        a.data, block_major(a.scale), b.data, block_major(b.scale), out, ends, rows, n, k, experts,
        MMA_MODE=mma_mode(a.data),
    )
    return out


def mx_grouped_mm_wgrad_triton(a: MXTensor, b: MXTensor, ends: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    n, rows_total = a.shape
    k = b.shape[0]
    if rows_total % BLOCK:
        raise ValueError(f"the token dimension {rows_total} is not a multiple of {BLOCK}")
    experts = ends.shape[0]
    out = torch.empty((experts, n, k), dtype=out_dtype, device=a.data.device)

    def grid(meta):
        return (triton.cdiv(n, meta["BLOCK_M"]) * triton.cdiv(k, meta["BLOCK_N"]), experts)

    _grouped_wgrad_kernel[grid](a.data, block_major(a.scale), b.data, block_major(b.scale), out, ends, n, k,
                                rows_total, MMA_MODE=mma_mode(a.data))
    return out
