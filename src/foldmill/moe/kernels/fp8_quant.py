"""Triton row-wise FP8 quantizer: one program per row, amax pass then scale-and-cast pass.

Matches quant/fp8.py (scale = max(amax, 1e-12) / 448, elements x / scale rounded to nearest even)
up to the float32 division, which both compute the same way; used for the FP8 row-wise backend.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rowwise_kernel(x_ptr, data_ptr, scale_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = row * cols
    amax = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        values = tl.load(x_ptr + base + offs, mask=offs < cols, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(values))
    scale = tl.maximum(tl.max(amax, axis=0), 1e-12) / 448.0
    for start in range(0, cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        values = tl.load(x_ptr + base + offs, mask=offs < cols, other=0.0).to(tl.float32)
        tl.store(data_ptr + base + offs, (values / scale).to(tl.float8e4nv), mask=offs < cols)
    tl.store(scale_ptr + row, scale)


def quantize_rowwise_triton(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    values = values.contiguous()
    cols = values.shape[-1]
    rows = values.numel() // cols
    data = torch.empty(values.shape, dtype=torch.float8_e4m3fn, device=values.device)
    scale = torch.empty(values.shape[:-1], dtype=torch.float32, device=values.device)
    _rowwise_kernel[(rows,)](values, data, scale, cols, BLOCK=min(triton.next_power_of_2(cols), 2048), num_warps=4)
    return data, scale


@triton.jit
def _group_columns_kernel(
    x_ptr, data_ptr, scale_ptr, ends_ptr, cols, stride_b, stride_r, stride_c,
    out_stride_g, out_stride_c, LOCAL_ROWS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    # Program (column block, group): amax over the group's rows, then scaled cast, written transposed.
    pid_c, group = tl.program_id(0), tl.program_id(1)
    start = tl.where(group > 0, tl.load(ends_ptr + group - 1, mask=group > 0, other=0), 0)
    stop = tl.load(ends_ptr + group)
    offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = offs_c < cols
    batch = group * LOCAL_ROWS
    x_base = x_ptr + batch.to(tl.int64) * stride_b + offs_c[None, :].to(tl.int64) * stride_c
    amax = tl.zeros((BLOCK_C,), dtype=tl.float32)
    for first in range(start, stop, BLOCK_R):
        offs_r = first + tl.arange(0, BLOCK_R)
        mask = (offs_r[:, None] < stop) & col_ok[None, :]
        local = offs_r - start * LOCAL_ROWS
        values = tl.load(x_base + local[:, None].to(tl.int64) * stride_r, mask=mask, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.max(tl.abs(values), axis=0))
    scale = tl.maximum(amax, 1e-12) / 448.0
    tl.store(scale_ptr + group * cols + offs_c, scale, mask=col_ok)
    out_base = data_ptr + group.to(tl.int64) * out_stride_g + offs_c[:, None].to(tl.int64) * out_stride_c
    for first in range(start, stop, BLOCK_R):
        offs_r = first + tl.arange(0, BLOCK_R)
        mask = (offs_r[:, None] < stop) & col_ok[None, :]
        local = offs_r - start * LOCAL_ROWS
        values = tl.load(x_base + local[:, None].to(tl.int64) * stride_r, mask=mask, other=0.0).to(tl.float32)
        quantized = tl.trans((values / scale[None, :]).to(tl.float8e4nv))
        tl.store(out_base + local[None, :], quantized, mask=tl.trans(mask))


def quantize_group_columns_triton(values: torch.Tensor, ends: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 of x (rows, C) with one scale per (group, column) over the group's rows.

    Returns the elements transposed, (C, rows) contiguous, and the scales (groups * C,) float32
    group-major: the layout of both operands of the FP8 weight-gradient GEMM.
    """
    rows, cols = values.shape
    groups = ends.shape[0]
    data = torch.empty((cols, rows), dtype=torch.float8_e4m3fn, device=values.device)
    scale = torch.empty((groups * cols,), dtype=torch.float32, device=values.device)
    grid = (triton.cdiv(cols, 64), groups)
    _group_columns_kernel[grid](values, data, scale, ends, cols, 0, *values.stride(), 0, rows, LOCAL_ROWS=0,
                                BLOCK_R=32, BLOCK_C=64, num_warps=4)
    return data, scale


def quantize_weight_columns_triton(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 of w (experts, N, K) with one scale per (expert, k) over N, elements as (experts, K, N)."""
    experts, n, k = weight.shape
    data = torch.empty((experts, k, n), dtype=torch.float8_e4m3fn, device=weight.device)
    scale = torch.empty((experts, k), dtype=torch.float32, device=weight.device)
    ends = torch.arange(1, experts + 1, device=weight.device, dtype=torch.int32) * n
    grid = (triton.cdiv(k, 64), experts)
    _group_columns_kernel[grid](weight, data, scale, ends, k, *weight.stride(), k * n, n, LOCAL_ROWS=1,
                                BLOCK_R=32, BLOCK_C=64, num_warps=4)
    return data, scale
