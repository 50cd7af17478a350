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
from triton.tools.tensor_descriptor import TensorDescriptor

from foldmill.moe.kernels import compute_capability
from foldmill.moe.kernels.grid import cdiv
from foldmill.moe.kernels.mx_quant import scale_factor
from foldmill.moe.quant.mx import BLOCK, MXTensor


@triton.jit
def _scaled_tile_product(
    acc, a_desc, sa_ptr, a_first, a_rows, b_desc, b_first, sb_ptr, b_scale_first, b_rows,
    block_start, block_stop, MMA_MODE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """acc += sum over 32-blocks kb in [block_start, block_stop) of
    (sa[kb, a row] * sb[kb, b row]) * a[a rows, kb*32:+32] @ b[b rows, kb*32:+32]^T
    for a's rows a_first.. and b's rows b_first.. (b's scales indexed from b_scale_first).

    The tiles arrive by TMA: a 64-bit pointer per element in registers spilled at every tile shape.
    Rows past a tensor's end read as 0. Scales are block-major (kb, row), a_rows / b_rows rows per
    block; rows past those read scale 1.
    """
    offs_m = a_first + tl.arange(0, BLOCK_M)
    offs_n = b_scale_first + tl.arange(0, BLOCK_N)
    m_ok, n_ok = offs_m < a_rows, offs_n < b_rows
    for kb in range(block_start, block_stop):
        a = a_desc.load([a_first, kb * 32])
        b = b_desc.load([b_first, kb * 32])
        sa = tl.load(sa_ptr + kb * a_rows + offs_m, mask=m_ok, other=127)
        sb = tl.load(sb_ptr + kb * b_rows + offs_n, mask=n_ok, other=127)
        if MMA_MODE == "fp8":
            acc += tl.dot(a, b.T) * (scale_factor(sa)[:, None] * scale_factor(sb)[None, :])
        elif MMA_MODE == "bf16":
            a16 = (a.to(tl.float32) * scale_factor(sa)[:, None]).to(tl.bfloat16)
            b16 = (b.to(tl.float32) * scale_factor(sb)[:, None]).to(tl.bfloat16)
            acc = tl.dot(a16, b16.T, acc)
        else:
            acc = tl.dot_scaled(a, sa[:, None], "e4m3", b.T, sb[:, None], "e4m3", acc=acc)
    return acc


# Tile shapes (BLOCK_M, BLOCK_N, warps, stages) that compile for sm_90 without spilled registers in
# every MMA_MODE (tests/test_moe_lowp.py builds each one).
CONFIGS = [(128, 128, 8, 4), (128, 128, 8, 6), (64, 256, 8, 4), (64, 128, 4, 4), (128, 64, 4, 4)]


def _tile_shapes(nargs: dict) -> None:
    """The TMA boxes follow the tile shape the autotuner is trying."""
    nargs["a_desc"].block_shape = [nargs["BLOCK_M"], BLOCK]
    nargs["b_desc"].block_shape = [nargs["BLOCK_N"], BLOCK]


def _configs() -> list[triton.Config]:
    return [
        triton.Config({"BLOCK_M": m, "BLOCK_N": n, "GROUP_M": 8}, num_warps=w, num_stages=s, pre_hook=_tile_shapes)
        for m, n, w, s in CONFIGS
    ]


@triton.autotune(configs=_configs(), key=["N", "K", "MMA_MODE"])
@triton.jit
def _grouped_forward_kernel(
    a_desc, sa_ptr, b_desc, sb_ptr, out_ptr, ends_ptr, rows_total, N, K, num_experts,
    MMA_MODE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr,
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
    for e in range(num_experts):
        group_stop = tl.load(ends_ptr + e)
        tiles = tl.cdiv(group_stop - group_start, BLOCK_M)
        hit = (remaining >= 0) & (remaining < tiles)
        expert = tl.where(hit, e, expert)
        row_start = tl.where(hit, group_start + remaining * BLOCK_M, row_start)
        row_stop = tl.where(hit, group_stop, row_stop)
        remaining -= tiles
        group_start = group_stop
    if expert >= 0:
        first_n = tile_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        # b is (experts * N, K): the tile's rows past N (the next expert's) and a's rows past
        # row_stop (the next group's) are computed and not stored. b's scales are (experts, K / 32, N).
        acc = _scaled_tile_product(acc, a_desc, sa_ptr, row_start, rows_total,
                                   b_desc, expert * N + first_n, sb_ptr + expert.to(tl.int64) * N * (K // 32),
                                   first_n, N, 0, K // 32, MMA_MODE, BLOCK_M, BLOCK_N)
        rows = row_start + tl.arange(0, BLOCK_M)
        cols = first_n + tl.arange(0, BLOCK_N)
        out_ptrs = out_ptr + rows[:, None].to(tl.int64) * N + cols[None, :]
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=(rows < row_stop)[:, None] & (cols < N)[None, :])


@triton.autotune(configs=_configs(), key=["N", "K", "MMA_MODE"])
@triton.jit
def _grouped_wgrad_kernel(
    a_desc, sa_ptr, b_desc, sb_ptr, out_ptr, ends_ptr, N, K,
    MMA_MODE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr,
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
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc = _scaled_tile_product(acc, a_desc, sa_ptr, tile_m * BLOCK_M, N, b_desc, tile_n * BLOCK_N, sb_ptr,
                               tile_n * BLOCK_N, K, group_start // 32, group_stop // 32, MMA_MODE, BLOCK_M, BLOCK_N)
    rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    out_ptrs = out_ptr + expert.to(tl.int64) * N * K + rows[:, None].to(tl.int64) * K + cols[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=(rows < N)[:, None] & (cols < K)[None, :])


def block_major(scale: torch.Tensor) -> torch.Tensor:
    """(..., rows, blocks) scales -> (..., blocks, rows) contiguous, so a K step reads one run of bytes."""
    return scale.transpose(-2, -1).contiguous()


def _descriptor(data: torch.Tensor) -> TensorDescriptor:
    """A TMA descriptor of a row-major 2-D FP8 tensor; the autotuner's pre-hook sets its box."""
    return TensorDescriptor.from_tensor(data.contiguous(), [1, BLOCK])


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
        max_m_tiles = cdiv(rows, meta["BLOCK_M"]) + experts
        return (max_m_tiles * cdiv(n, meta["BLOCK_N"]),)

    _grouped_forward_kernel[grid](
        _descriptor(a.data), block_major(a.scale), _descriptor(b.data.reshape(experts * n, k)), block_major(b.scale),
        out, ends, rows, n, k, experts, MMA_MODE=mma_mode(a.data),
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
        return (cdiv(n, meta["BLOCK_M"]) * cdiv(k, meta["BLOCK_N"]), experts)

    _grouped_wgrad_kernel[grid](_descriptor(a.data), block_major(a.scale), _descriptor(b.data), block_major(b.scale),
                                out, ends, n, k, MMA_MODE=mma_mode(a.data))
    return out
