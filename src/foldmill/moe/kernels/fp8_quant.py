"""Triton FP8 quantizers: row-wise (one program per row), and per (expert group, column) written
transposed for the weight-gradient GEMM and the weights' dgrad copy, optionally with the row-wise
copy from the same passes (every operand of the FP8 backend needs both layouts).

Match quant/fp8.py (scale = max(amax, 1e-12) / 448, elements x / scale rounded to nearest even)
up to the float32 division, which both compute the same way; used for the FP8 row-wise backend.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from foldmill.moe.kernels.grid import cdiv, next_power_of_2


@triton.jit
def _scale_of(amax):
    """The dequantization scale of values whose largest magnitude is amax (quant/fp8.py's rule)."""
    return tl.maximum(amax, 1e-12) / 448.0


@triton.jit
def _rowwise_kernel(x_ptr, data_ptr, scale_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = row * cols
    amax = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        values = tl.load(x_ptr + base + offs, mask=offs < cols, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(values))
    scale = _scale_of(tl.max(amax, axis=0))
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
    _rowwise_kernel[(rows,)](values, data, scale, cols, BLOCK=min(next_power_of_2(cols), 2048), num_warps=4)
    return data, scale


# Per (group, column) quantization needs each group's column maxima before any element is written,
# so it reads the tensor twice. The first read is a grid of (64, 256) tiles, each writing its rows'
# maxima over its columns and its columns' maxima over every 16 rows. Activation group starts are
# multiples of 16 (the FP8 backend pads each expert's rows to 16), so a 16-row partial belongs to one
# group; a group starting elsewhere would share a partial with its neighbour and get a scale that
# covers both (coarser, never overflowing). Weights use the largest power of two dividing N, up to
# 16. One small kernel reduces the partials to row and group-column scales and zeroes the row scales
# past the groups (one launch instead of three: both copies of a 16,384 x 2,048 activation take
# 0.078 ms in a CUDA graph instead of 0.082, the weights' copies 0.26 ms of host time per call
# instead of 0.37-0.48); the second read casts both copies, the transposed one stored by TMA when
# its shape allows.
# Measured on the H200 at bio_8x1b's step shapes (16,384 rows in 8 groups, and its expert weights)
# against the previous design (programs per group, column block and 1,024-row chunk; row maxima by
# atomics): the captured FP8 training step 2.2-2.8% faster at 2 x 4,096 tokens, 1.7-2.5% at
# 8 x 4,096 (three runs of two alternating rounds). The group-column reduction keeps elementwise
# maxima over its loop and reduces once at the end, on 128 x 32 tiles: 0.06 ms per layer's
# operands in a CUDA graph instead of 0.10 with a reduction per 32 x 128 tile. TMA loads, TMA
# row-wise stores, 128-row or 128-column cast tiles, transposing before the cast and cast programs
# looping over row tiles were slower or no faster; every choice here compiles without spills
# (tests/test_moe_lowp.py).
_SUB = 16
_MAXIMA_BLOCK_R, _MAXIMA_BLOCK_C, _MAXIMA_WARPS = 64, 256, 4
_CAST_BLOCK_R, _CAST_BLOCK_C, _CAST_WARPS = 64, 64, 4
# The group-column reduction: 16-row partials by columns per program; the row reduction: column-block
# partials by rows per program.
_GROUP_BLOCK_S, _GROUP_BLOCK_C = 128, 32
_ROW_BLOCK_P, _ROW_BLOCK_R = 8, 256
# Without TMA (copies whose rows are not a multiple of 16) 4 warps would use local memory on sm_90.
_CAST_POINTER_WARPS = 8


@triton.jit
def _tile_maxima_kernel(x_ptr, row_partial_ptr, col_partial_ptr, ends_ptr, groups, rows, cols, stride_r,
                        SUBS: tl.constexpr, SUB: tl.constexpr, BLOCK_C: tl.constexpr):
    """Tile (SUBS * SUB rows, BLOCK_C columns): its rows' maxima over its columns into
    row_partial[column block], its columns' maxima over each SUB rows into col_partial[row // SUB]."""
    pid_s, pid_c = tl.program_id(0), tl.program_id(1)
    end = tl.load(ends_ptr + groups - 1)
    if pid_s * SUBS * SUB < end:
        offs_s = pid_s * SUBS + tl.arange(0, SUBS)
        offs_r = offs_s[:, None] * SUB + tl.arange(0, SUB)[None, :]
        offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
        row_ok = offs_r < end
        col_ok = offs_c < cols
        mask = row_ok[:, :, None] & col_ok[None, None, :]
        magnitudes = tl.abs(tl.load(x_ptr + offs_r[:, :, None].to(tl.int64) * stride_r + offs_c[None, None, :],
                                    mask=mask, other=0.0))
        # The maximum of bf16 magnitudes is one of them: col_partial keeps the input's dtype, exactly.
        tl.store(col_partial_ptr + offs_s[:, None].to(tl.int64) * cols + offs_c[None, :], tl.max(magnitudes, axis=1),
                 mask=(offs_s[:, None] * SUB < end) & col_ok[None, :])
        tl.store(row_partial_ptr + pid_c * rows + offs_r, tl.max(magnitudes, axis=2).to(tl.float32), mask=row_ok)


@triton.jit
def _row_scales(row_partial_ptr, row_scale_ptr, end, rows, partials, block, BLOCK_P: tl.constexpr,
                BLOCK_R: tl.constexpr):
    """Scales of rows [block * BLOCK_R, ...) from their per-column-block maxima; zero past `end`."""
    offs_r = block * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = offs_r < end
    amax = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for p in range(0, partials, BLOCK_P):
        offs_p = p + tl.arange(0, BLOCK_P)
        partial = tl.load(row_partial_ptr + offs_p[:, None] * rows + offs_r[None, :],
                          mask=(offs_p[:, None] < partials) & row_ok[None, :], other=0.0)
        amax = tl.maximum(amax, tl.max(partial, axis=0))
    tl.store(row_scale_ptr + offs_r, tl.where(row_ok, _scale_of(amax), 0.0), mask=offs_r < rows)


@triton.jit
def _group_scales(col_partial_ptr, ends_ptr, scale_ptr, cols, pid_c, group, BLOCK_S: tl.constexpr,
                  BLOCK_C: tl.constexpr, SUB: tl.constexpr):
    """Scales of `group`'s columns [pid_c * BLOCK_C, ...) from their SUB-row maxima."""
    start = tl.load(ends_ptr + group - 1, mask=group > 0, other=0)
    stop = tl.load(ends_ptr + group)
    offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = offs_c < cols
    # Elementwise maxima across the loop, one reduction over the tile's rows at the end.
    amax = tl.zeros((BLOCK_S, BLOCK_C), dtype=tl.float32)
    for sub in range(start // SUB, (stop + SUB - 1) // SUB, BLOCK_S):
        offs_s = sub + tl.arange(0, BLOCK_S)
        partial = tl.load(col_partial_ptr + offs_s[:, None].to(tl.int64) * cols + offs_c[None, :],
                          mask=(offs_s[:, None] * SUB < stop) & col_ok[None, :], other=0.0)
        amax = tl.maximum(amax, partial.to(tl.float32))
    tl.store(scale_ptr + group * cols + offs_c, _scale_of(tl.max(amax, axis=0)), mask=col_ok)


@triton.jit
def _scales_kernel(col_partial_ptr, row_partial_ptr, ends_ptr, scale_ptr, row_scale_ptr, groups, rows, cols,
                   partials, col_blocks, ROWWISE: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr,
                   SUB: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_R: tl.constexpr):
    """Both reductions of the maxima in one launch: the first col_blocks * groups programs write the
    group-column scales, the rest (with ROWWISE) the row scales."""
    pid = tl.program_id(0)
    if pid < col_blocks * groups:
        _group_scales(col_partial_ptr, ends_ptr, scale_ptr, cols, pid % col_blocks, pid // col_blocks,
                      BLOCK_S, BLOCK_C, SUB)
    elif ROWWISE:
        _row_scales(row_partial_ptr, row_scale_ptr, tl.load(ends_ptr + groups - 1), rows, partials,
                    pid - col_blocks * groups, BLOCK_P, BLOCK_R)


@triton.jit
def _groups_of(ends_ptr, groups, rows, GROUPS: tl.constexpr):
    """The group holding each of `rows` (1-D): the number of group ends at or before it. GROUPS is
    a power of two >= groups; one vector load of the ends, not a load per group."""
    offs_g = tl.arange(0, GROUPS)
    ends = tl.load(ends_ptr + offs_g, mask=offs_g < groups, other=2147483647)
    return tl.sum((ends[None, :] <= rows[:, None]).to(tl.int32), axis=1)


@triton.jit
def _cast_kernel(x_ptr, ends_ptr, scale_ptr, data_ptr, data_desc, row_data_ptr, row_scale_ptr, groups, cols,
                 stride_r, out_stride_c, out_group_shift, group_rows, ROWWISE: tl.constexpr, TMA: tl.constexpr,
                 BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, GROUPS: tl.constexpr):
    """Element (r, c) of group g goes to data[g * out_group_shift + c * out_stride_c + r], through
    data_desc (groups or 1, cols, rows of a group or all) where TMA is set; the row-wise copy to
    row_data[r, c]."""
    pid_r, pid_c = tl.program_id(0), tl.program_id(1)
    end = tl.load(ends_ptr + groups - 1)
    first = pid_r * BLOCK_R
    if first < end:
        offs_r = first + tl.arange(0, BLOCK_R)
        row_ok = offs_r < end
        offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
        col_ok = offs_c < cols
        mask = row_ok[:, None] & col_ok[None, :]
        values = tl.load(x_ptr + offs_r[:, None].to(tl.int64) * stride_r + offs_c[None, :], mask=mask,
                         other=0.0).to(tl.float32)
        if ROWWISE:
            row_scale = tl.load(row_scale_ptr + offs_r, mask=row_ok, other=1.0)
            tl.store(row_data_ptr + offs_r[:, None].to(tl.int64) * cols + offs_c[None, :],
                     (values / row_scale[:, None]).to(tl.float8e4nv), mask=mask)
        g_first, g_last = tl.split(_groups_of(ends_ptr, groups, tl.join(first, tl.minimum(first + BLOCK_R, end) - 1),
                                              GROUPS))
        if g_first == g_last:
            group_scale = tl.load(scale_ptr + g_first * cols + offs_c, mask=col_ok, other=1.0)
            quantized = tl.trans((values / group_scale[None, :]).to(tl.float8e4nv))
            if TMA:
                # Rows past `end` land in the copy's padding columns, which no GEMM reads.
                data_desc.store([g_first * (group_rows > 0), pid_c * BLOCK_C, first - g_first * group_rows],
                                tl.reshape(quantized, (1, BLOCK_C, BLOCK_R)))
            else:
                tl.store(data_ptr + g_first.to(tl.int64) * out_group_shift + offs_c[:, None].to(tl.int64) * out_stride_c
                         + offs_r[None, :], quantized, mask=tl.trans(mask))
        else:  # the tile straddles a group boundary
            row_group = _groups_of(ends_ptr, groups, offs_r, GROUPS)
            row_group_scale = tl.load(scale_ptr + row_group[:, None] * cols + offs_c[None, :], mask=mask, other=1.0)
            quantized = tl.trans((values / row_group_scale).to(tl.float8e4nv))
            tl.store(data_ptr + row_group[None, :].to(tl.int64) * out_group_shift
                     + offs_c[:, None].to(tl.int64) * out_stride_c + offs_r[None, :], quantized, mask=tl.trans(mask))


def _quantize_group_columns(values: torch.Tensor, ends: torch.Tensor, data: torch.Tensor, scale: torch.Tensor,
                            group_rows: int, rowwise: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """Per (group, column) copy of values (rows, cols) into data/scale; with `rowwise` (data, scale),
    the row-wise copy too. data is (cols, rows) for activations (group_rows 0) or (groups, cols,
    group_rows) for weights, each group's rows written to its own block."""
    sub = math.gcd(group_rows, _SUB) if group_rows else _SUB
    rows, cols = values.shape
    groups = ends.shape[0]
    partials = cdiv(cols, _MAXIMA_BLOCK_C)
    row_partial = torch.empty((partials, rows), dtype=torch.float32, device=values.device)
    col_partial = torch.empty((cdiv(rows, sub), cols), dtype=values.dtype, device=values.device)
    _tile_maxima_kernel[(cdiv(rows, _MAXIMA_BLOCK_R), partials)](
        values, row_partial, col_partial, ends, groups, rows, cols, values.stride(0), SUBS=_MAXIMA_BLOCK_R // sub,
        SUB=sub, BLOCK_C=_MAXIMA_BLOCK_C, num_warps=_MAXIMA_WARPS)
    with_rows = rowwise is not None
    row_data, row_scale = rowwise if with_rows else (data, scale)
    col_blocks = cdiv(cols, _GROUP_BLOCK_C)
    row_blocks = cdiv(rows, _ROW_BLOCK_R) if with_rows else 0
    _scales_kernel[(col_blocks * groups + row_blocks,)](
        col_partial, row_partial, ends, scale, row_scale, groups, rows, cols, partials, col_blocks,
        ROWWISE=with_rows, BLOCK_S=_GROUP_BLOCK_S, BLOCK_C=_GROUP_BLOCK_C, SUB=sub, BLOCK_P=_ROW_BLOCK_P,
        BLOCK_R=_ROW_BLOCK_R, num_warps=4)
    # TMA needs 16-byte strides: the copy's rows (fp8 elements) a multiple of 16.
    blocks = data.view(-1, cols, group_rows or rows)
    use_tma = rows > 0 and blocks.shape[-1] % 16 == 0
    data_desc = TensorDescriptor.from_tensor(blocks, [1, _CAST_BLOCK_C, _CAST_BLOCK_R]) if use_tma else None
    out_group_shift = (cols - 1) * group_rows  # block g starts at g * cols * group_rows, its rows at g * group_rows
    _cast_kernel[(cdiv(rows, _CAST_BLOCK_R), cdiv(cols, _CAST_BLOCK_C))](
        values, ends, scale, data, data_desc, row_data, row_scale, groups, cols, values.stride(0),
        group_rows or rows, out_group_shift, group_rows, ROWWISE=with_rows, TMA=use_tma,
        BLOCK_R=_CAST_BLOCK_R, BLOCK_C=_CAST_BLOCK_C, GROUPS=next_power_of_2(groups),
        num_warps=_CAST_WARPS if use_tma else _CAST_POINTER_WARPS, num_stages=1)


def quantize_group_columns_triton(values: torch.Tensor, ends: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 of x (rows, C) with one scale per (group, column) over the group's rows.

    Returns the elements transposed, (C, rows) contiguous, and the scales (groups * C,) float32
    group-major: the layout of both operands of the FP8 weight-gradient GEMM.
    """
    values = values.contiguous()
    rows, cols = values.shape
    data = torch.empty((cols, rows), dtype=torch.float8_e4m3fn, device=values.device)
    scale = torch.empty((ends.shape[0] * cols,), dtype=torch.float32, device=values.device)
    _quantize_group_columns(values, ends, data, scale, 0)
    return data, scale


def quantize_rows_and_group_columns_triton(values: torch.Tensor, ends: torch.Tensor):
    """Both FP8 copies of x (rows, C) the grouped GEMMs need, from one read for the maxima and one
    for the casts: row-wise ((rows, C), (rows,)) as quantize_rowwise, and per (group, column)
    ((C, rows), (groups * C,)) as quantize_group_columns_triton. Rows past ends[-1] are left unset
    (their scales zero)."""
    values = values.contiguous()
    rows, cols = values.shape
    row_data = torch.empty((rows, cols), dtype=torch.float8_e4m3fn, device=values.device)
    row_scale = torch.empty(rows, dtype=torch.float32, device=values.device)
    data = torch.empty((cols, rows), dtype=torch.float8_e4m3fn, device=values.device)
    scale = torch.empty((ends.shape[0] * cols,), dtype=torch.float32, device=values.device)
    _quantize_group_columns(values, ends, data, scale, 0, rowwise=(row_data, row_scale))
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
    ends = torch.arange(n, (experts + 1) * n, n, device=weight.device, dtype=torch.int32)
    # Experts as groups of n rows of the (experts * n, k) view, each written to its own (k, n) block.
    _quantize_group_columns(weight.view(experts * n, k), ends, data, scale.view(-1), n,
                            rowwise=None if rows is None else (rows[0], rows[1].view(-1)))
    return rows, (data, scale)
