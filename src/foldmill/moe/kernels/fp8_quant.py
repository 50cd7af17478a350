"""Triton FP8 quantizers: row-wise (one program per row), and per (expert group, column) written
transposed for the weight-gradient GEMM and the weights' dgrad copy, optionally with the row-wise
copy from the same passes (every operand of the FP8 backend needs both layouts).

Match quant/fp8.py (scale = max(amax, 1e-12) / 448, elements x / scale rounded to nearest even)
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


# Per (group, column) quantization: the scale needs the whole group's column maximum before any
# element is written, and the elements go out transposed (the slow part). One program per
# (column block, group) starves the GPU on small groups, so both passes split each group into
# row chunks: partial maxima first, then each chunk reduces its group's partials and casts.
@triton.jit
def _partial_amax_kernel(x_ptr, partial_ptr, row_amax_ptr, ends_ptr, cols, stride_r, chunks, ROWWISE: tl.constexpr,
                         CHUNK: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    pid_c, group, chunk = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    start = tl.where(group > 0, tl.load(ends_ptr + group - 1, mask=group > 0, other=0), 0)
    stop = tl.load(ends_ptr + group)
    first = start + chunk * CHUNK
    last = tl.minimum(first + CHUNK, stop)
    offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = offs_c < cols
    amax = tl.zeros((BLOCK_C,), dtype=tl.float32)
    for row in range(first, last, BLOCK_R):
        offs_r = row + tl.arange(0, BLOCK_R)
        mask = (offs_r[:, None] < last) & col_ok[None, :]
        values = tl.load(x_ptr + offs_r[:, None].to(tl.int64) * stride_r + offs_c[None, :], mask=mask, other=0.0)
        magnitudes = tl.abs(values.to(tl.float32))
        amax = tl.maximum(amax, tl.max(magnitudes, axis=0))
        if ROWWISE:
            tl.atomic_max(row_amax_ptr + offs_r, tl.max(magnitudes, axis=1), mask=offs_r < last)
    tl.store(partial_ptr + (group * chunks + chunk).to(tl.int64) * cols + offs_c, amax, mask=col_ok)


@triton.jit
def _chunk_cast_kernel(
    x_ptr, partial_ptr, ends_ptr, data_ptr, scale_ptr, row_amax_ptr, row_data_ptr, row_scale_ptr, cols, stride_r,
    chunks, out_stride_g, out_stride_c, ROWWISE: tl.constexpr, LOCAL_ROWS: tl.constexpr, CHUNK: tl.constexpr,
    CHUNKS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    pid_c, group, chunk = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    start = tl.where(group > 0, tl.load(ends_ptr + group - 1, mask=group > 0, other=0), 0)
    stop = tl.load(ends_ptr + group)
    first = start + chunk * CHUNK
    # Chunk 0 always runs: it writes the scale, also for an empty group.
    if first < stop or chunk == 0:
        last = tl.minimum(first + CHUNK, stop)
        offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
        col_ok = offs_c < cols
        offs_k = tl.arange(0, CHUNKS)
        partial = tl.load(partial_ptr + (group * chunks + offs_k[:, None]).to(tl.int64) * cols + offs_c[None, :],
                          mask=(offs_k[:, None] < chunks) & col_ok[None, :], other=0.0)
        scale = tl.maximum(tl.max(partial, axis=0), 1e-12) / 448.0
        if chunk == 0:
            tl.store(scale_ptr + group * cols + offs_c, scale, mask=col_ok)
        out_base = data_ptr + group.to(tl.int64) * out_stride_g + offs_c[:, None].to(tl.int64) * out_stride_c
        for row in range(first, last, BLOCK_R):
            offs_r = row + tl.arange(0, BLOCK_R)
            mask = (offs_r[:, None] < last) & col_ok[None, :]
            values = tl.load(x_ptr + offs_r[:, None].to(tl.int64) * stride_r + offs_c[None, :], mask=mask, other=0.0)
            values = values.to(tl.float32)
            if ROWWISE:
                row_ok = offs_r < last
                row_scale = tl.maximum(tl.load(row_amax_ptr + offs_r, mask=row_ok, other=0.0), 1e-12) / 448.0
                tl.store(row_data_ptr + offs_r[:, None].to(tl.int64) * cols + offs_c[None, :],
                         (values / row_scale[:, None]).to(tl.float8e4nv), mask=mask)
                if pid_c == 0:
                    tl.store(row_scale_ptr + offs_r, row_scale, mask=row_ok)
            quantized = tl.trans((values / scale[None, :]).to(tl.float8e4nv))
            out_rows = offs_r - start if LOCAL_ROWS else offs_r
            tl.store(out_base + out_rows[None, :], quantized, mask=tl.trans(mask))


# Row chunk, rows per iteration, columns per program, warps and pipeline stages, measured on the
# H200 over 15 choices for both copies at once, at bio_8x1b's step shapes (16,384 rows in 8 groups
# of 2,048-8,192 columns, and its expert weights): 1.78 ms per layer against 2.01 for the best
# per-column-only choice. 256-row tiles were 4% faster but spill registers on sm_90; every choice
# here compiles without spills (tests/test_moe_lowp.py).
_CHUNK, _BLOCK_R, _BLOCK_C, _WARPS, _STAGES = 1024, 128, 32, 4, 2


def _quantize_group_columns(values: torch.Tensor, ends: torch.Tensor, data: torch.Tensor, scale: torch.Tensor,
                            local_rows: bool, out_stride_g: int, out_stride_c: int,
                            rowwise: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """Per (group, column) copy into data/scale; with `rowwise` (data, scale), the row-wise copy too,
    from the same two passes over `values` (rows inside the groups only)."""
    rows, cols = values.shape
    groups = ends.shape[0]
    # A group holds at most all rows: this many chunks covers the largest one.
    chunks = triton.cdiv(rows, _CHUNK)
    partial = torch.empty((groups, chunks, cols), dtype=torch.float32, device=values.device)
    row_amax = torch.zeros(rows if rowwise else 1, dtype=torch.float32, device=values.device)
    row_data, row_scale = rowwise if rowwise else (data, scale)
    grid = (triton.cdiv(cols, _BLOCK_C), groups, chunks)
    _partial_amax_kernel[grid](values, partial, row_amax, ends, cols, values.stride(0), chunks,
                               ROWWISE=rowwise is not None, CHUNK=_CHUNK, BLOCK_R=_BLOCK_R, BLOCK_C=_BLOCK_C,
                               num_warps=_WARPS, num_stages=_STAGES)
    _chunk_cast_kernel[grid](values, partial, ends, data, scale, row_amax, row_data, row_scale, cols,
                             values.stride(0), chunks, out_stride_g, out_stride_c, ROWWISE=rowwise is not None,
                             LOCAL_ROWS=local_rows, CHUNK=_CHUNK, CHUNKS=max(triton.next_power_of_2(chunks), 2),
                             BLOCK_R=_BLOCK_R, BLOCK_C=_BLOCK_C, num_warps=_WARPS, num_stages=_STAGES)


def quantize_group_columns_triton(values: torch.Tensor, ends: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 of x (rows, C) with one scale per (group, column) over the group's rows.

    Returns the elements transposed, (C, rows) contiguous, and the scales (groups * C,) float32
    group-major: the layout of both operands of the FP8 weight-gradient GEMM.
    """
    values = values.contiguous()
    rows, cols = values.shape
    data = torch.empty((cols, rows), dtype=torch.float8_e4m3fn, device=values.device)
    scale = torch.empty((ends.shape[0] * cols,), dtype=torch.float32, device=values.device)
    _quantize_group_columns(values, ends, data, scale, False, 0, rows)
    return data, scale


def quantize_rows_and_group_columns_triton(values: torch.Tensor, ends: torch.Tensor):
    """Both FP8 copies of x (rows, C) the grouped GEMMs need, from one read for the maxima and one
    for the casts: row-wise ((rows, C), (rows,)) as quantize_rowwise, and per (group, column)
    ((C, rows), (groups * C,)) as quantize_group_columns_triton. Rows past ends[-1] are left unset
    (their scales zero)."""
    values = values.contiguous()
    rows, cols = values.shape
    row_data = torch.empty((rows, cols), dtype=torch.float8_e4m3fn, device=values.device)
    row_scale = torch.zeros(rows, dtype=torch.float32, device=values.device)
    data = torch.empty((cols, rows), dtype=torch.float8_e4m3fn, device=values.device)
    scale = torch.empty((ends.shape[0] * cols,), dtype=torch.float32, device=values.device)
    _quantize_group_columns(values, ends, data, scale, False, 0, rows, rowwise=(row_data, row_scale))
    return (row_data, row_scale), (data, scale)


def quantize_weight_columns_triton(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 of w (experts, N, K) with one scale per (expert, k) over N, elements as (experts, K, N)."""
    return _quantize_weight(weight, rowwise=False)[1]


def quantize_weight_copies_triton(weight: torch.Tensor):
    """Both FP8 copies of w (experts, N, K) in two passes: row-wise over K ((experts, N, K),
    (experts, N)) for the forward GEMM, and per (expert, k) over N ((experts, K, N), (experts, K))
    for dgrad."""
    return _quantize_weight(weight, rowwise=True)


def _quantize_weight(weight: torch.Tensor, rowwise: bool):
    weight = weight.contiguous()
    experts, n, k = weight.shape
    data = torch.empty((experts, k, n), dtype=torch.float8_e4m3fn, device=weight.device)
    scale = torch.empty((experts, k), dtype=torch.float32, device=weight.device)
    rows = None
    if rowwise:
        rows = (torch.empty_like(weight, dtype=torch.float8_e4m3fn),
                torch.empty((experts, n), dtype=torch.float32, device=weight.device))
    ends = torch.arange(1, experts + 1, device=weight.device, dtype=torch.int32) * n
    # Experts as groups of n rows of the (experts * n, k) view, each written to its own (k, n) block.
    _quantize_group_columns(weight.view(experts * n, k), ends, data, scale.view(-1), True, k * n, n,
                            rowwise=None if rows is None else (rows[0], rows[1].view(-1)))
    return rows, (data, scale)
