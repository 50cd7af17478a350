"""Triton MXFP8 quantizer: E4M3 elements, RCEIL E8M0 scale per 32 values along the last dimension.

Same rules as quant/mx_reference.py, bit for bit: exponent from the block maximum's bits
(e = exp(amax) - 8, plus one when amax's mantissa exceeds 1.75 = 448 / 2^8; clamped at -127);
elements x * 2^-e, which is exact, then one round-to-nearest-even cast; blocks holding NaN or Inf
become scale 0xFF with NaN elements. Reads any strides (so transposed copies for dgrad and wgrad
are quantized straight from the bf16 tensor), writes contiguous data and scales.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from foldmill.moe.quant.mx import BLOCK, MXTensor


@triton.jit
def flush_below_e4m3(scaled):
    """Signed zero for |x| <= 2^-10 (half the smallest E4M3 subnormal, a tie that rounds to even 0):
    the hardware float32 -> E4M3 conversion returns wrong bytes for float32 subnormal inputs."""
    return tl.where(tl.abs(scaled) <= 0.0009765625, scaled * 0.0, scaled)


@triton.jit
def _rceil_exponent(amax):
    """RCEIL scale exponent (int32) of non-negative finite float32 block maxima, clamped at -127."""
    bits = amax.to(tl.int32, bitcast=True)
    exponent_field = bits >> 23
    mantissa_above = ((bits & 0x7FFFFF) > 0x600000).to(tl.int32)
    exponent = tl.where(exponent_field == 0, -127, exponent_field - 135 + mantissa_above)
    return tl.maximum(exponent, -127)


@triton.jit
def mx_quantize_blocks(values):
    """values (rows, blocks, 32) float32 -> (float8e4nv elements, uint8 scales (rows, blocks))."""
    finite = values == values
    finite = finite & (tl.abs(values) != float("inf"))
    block_finite = tl.min(finite.to(tl.int32), axis=2) == 1
    amax = tl.max(tl.where(finite, tl.abs(values), 0.0), axis=2)
    exponent = _rceil_exponent(amax)
    inverse = ((127 - exponent) << 23).to(tl.float32, bitcast=True)
    scaled = flush_below_e4m3(values * inverse[:, :, None])
    scaled = tl.where(block_finite[:, :, None], scaled, float("nan"))
    scale = tl.where(block_finite, exponent + 127, 255).to(tl.uint8)
    return scaled.to(tl.float8e4nv), scale


@triton.jit
def _quantize_kernel(
    x_ptr, data_ptr, scale_ptr, rows, cols,
    stride_xb, stride_xr, stride_xc,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    pid_r, pid_c, batch = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (offs_r[:, None] < rows) & (offs_c[None, :] < cols)
    x_ptrs = x_ptr + batch * stride_xb + offs_r[:, None] * stride_xr + offs_c[None, :] * stride_xc
    values = tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)
    elements, scales = mx_quantize_blocks(tl.reshape(values, (BLOCK_R, BLOCK_C // 32, 32)))
    out_offsets = batch * rows * cols + offs_r[:, None] * cols + offs_c[None, :]
    tl.store(data_ptr + out_offsets, tl.reshape(elements, (BLOCK_R, BLOCK_C)), mask=mask)
    offs_s = pid_c * (BLOCK_C // 32) + tl.arange(0, BLOCK_C // 32)
    scale_offsets = batch * rows * (cols // 32) + offs_r[:, None] * (cols // 32) + offs_s[None, :]
    tl.store(scale_ptr + scale_offsets, scales, mask=(offs_r[:, None] < rows) & (offs_s[None, :] < cols // 32))


def quantize_mx_triton(values: torch.Tensor) -> MXTensor:
    """MXFP8 of a 2-D or 3-D CUDA tensor (any strides) along its last dimension."""
    if values.shape[-1] % BLOCK:
        raise ValueError(f"MXFP8 needs the last dimension to be a multiple of {BLOCK}, got {values.shape[-1]}")
    view = values if values.dim() == 3 else values.unsqueeze(0)
    batches, rows, cols = view.shape
    data = torch.empty(view.shape, dtype=torch.float8_e4m3fn, device=values.device)
    scale = torch.empty((batches, rows, cols // BLOCK), dtype=torch.uint8, device=values.device)
    block_r, block_c = 32, 128
    grid = (triton.cdiv(rows, block_r), triton.cdiv(cols, block_c), batches)
    _quantize_kernel[grid](view, data, scale, rows, cols, *view.stride(), BLOCK_R=block_r, BLOCK_C=block_c,
                           num_warps=4)
    if values.dim() == 2:
        data, scale = data[0], scale[0]
    return MXTensor(data, scale)


@triton.jit
def mx_quantize_columns(values):
    """values (32, C) float32, one block per column -> (float8e4nv elements (32, C), uint8 scales (C,))."""
    finite = values == values
    finite = finite & (tl.abs(values) != float("inf"))
    block_finite = tl.min(finite.to(tl.int32), axis=0) == 1
    amax = tl.max(tl.where(finite, tl.abs(values), 0.0), axis=0)
    exponent = _rceil_exponent(amax)
    inverse = ((127 - exponent) << 23).to(tl.float32, bitcast=True)
    scaled = tl.where(block_finite[None, :], flush_below_e4m3(values * inverse[None, :]), float("nan"))
    scale = tl.where(block_finite, exponent + 127, 255).to(tl.uint8)
    return scaled.to(tl.float8e4nv), scale


@triton.jit
def scale_factor(scales):
    """E8M0 bytes -> float32 2^(byte - 127); 0 is the subnormal 2^-127, 255 is NaN."""
    factor = (scales.to(tl.int32) << 23).to(tl.float32, bitcast=True)
    factor = tl.where(scales == 0, 5.877471754111438e-39, factor)
    return tl.where(scales == 255, float("nan"), factor)


@triton.jit
def mx_dequantize_blocks(elements, scales):
    """(rows, blocks, 32) E4M3 elements and (rows, blocks) E8M0 scales -> exact float32 values."""
    return elements.to(tl.float32) * scale_factor(scales)[:, :, None]


@triton.jit
def _dual_kernel(
    x_ptr, by_cols_ptr, by_rows_ptr, mx_data_ptr, mx_scale_ptr, rows, cols,
    stride_xb, stride_xr, stride_xc,
    ALONG_COLS_VALUES: tl.constexpr, ALONG_ROWS_VALUES: tl.constexpr, ALONG_ROWS_MX: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    # One 32-row tile: blocks along the columns (per row) and along the rows (per column) at once.
    pid_r, pid_c, batch = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_r = pid_r * 32 + tl.arange(0, 32)
    offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (offs_r[:, None] < rows) & (offs_c[None, :] < cols)
    x_ptrs = x_ptr + batch * stride_xb + offs_r[:, None].to(tl.int64) * stride_xr + offs_c[None, :] * stride_xc
    values = tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)
    out = batch.to(tl.int64) * rows * cols + offs_r[:, None].to(tl.int64) * cols + offs_c[None, :]
    if ALONG_COLS_VALUES:
        elements, scales = mx_quantize_blocks(tl.reshape(values, (32, BLOCK_C // 32, 32)))
        exact = tl.reshape(mx_dequantize_blocks(elements, scales), (32, BLOCK_C))
        tl.store(by_cols_ptr + out, exact.to(by_cols_ptr.dtype.element_ty), mask=mask)
    if ALONG_ROWS_VALUES or ALONG_ROWS_MX:
        column_elements, column_scales = mx_quantize_columns(values)
        if ALONG_ROWS_VALUES:
            exact = column_elements.to(tl.float32) * scale_factor(column_scales)[None, :]
            tl.store(by_rows_ptr + out, exact.to(by_rows_ptr.dtype.element_ty), mask=mask)
        if ALONG_ROWS_MX:
            tl.store(mx_data_ptr + out, column_elements, mask=mask)
            scale_offsets = batch.to(tl.int64) * (rows // 32) * cols + pid_r * cols + offs_c
            tl.store(mx_scale_ptr + scale_offsets, column_scales, mask=offs_c < cols)


# Columns per 32-row program and warps, measured on the H200 over 16 and 12 choices at bio_8x1b's
# operand shapes: the round trips of one layer's operands take 1.59 ms against 1.78 with 4 warps;
# the dequantization 0.15 ms against 0.20 with 64 columns. Both compile without spills
# (tests/test_moe_lowp.py); all three outputs at once would spill with 2 warps, so take 4 there.
_DUAL_BLOCK_C, _DUAL_WARPS = 64, 2
_DEQUANT_BLOCK_C, _DEQUANT_WARPS = 256, 2


def mx_round_trip_triton(
    values: torch.Tensor, along_cols: bool, along_rows: bool, keep_along_rows: bool, dtype: torch.dtype
) -> tuple[torch.Tensor | None, torch.Tensor | None, MXTensor | None]:
    """The exact values of MXFP8 copies of a 2-D or 3-D tensor (any strides), as `dtype`, in one pass.

    along_cols: blocks of 32 along the last dimension (each row's own blocks);
    along_rows: blocks of 32 along the second-last dimension (each column's own blocks);
    keep_along_rows: also the along-rows copy itself, as an MXTensor of the transposed view
    (data (..., cols, rows) viewed from contiguous (..., rows, cols) storage).
    Returns (blocks-along-cols values, blocks-along-rows values, blocks-along-rows MXFP8).
    """
    view = values if values.dim() == 3 else values.unsqueeze(0)
    batches, rows, cols = view.shape
    if cols % BLOCK or (rows % BLOCK and (along_rows or keep_along_rows)):
        raise ValueError(f"MXFP8 blocks of {BLOCK} need both dimensions to be multiples of {BLOCK}, "
                         f"got {tuple(view.shape)}")
    device = values.device
    by_cols = torch.empty(view.shape, dtype=dtype, device=device) if along_cols else None
    by_rows = torch.empty(view.shape, dtype=dtype, device=device) if along_rows else None
    data = torch.empty(view.shape, dtype=torch.float8_e4m3fn, device=device) if keep_along_rows else None
    scale = torch.empty((batches, rows // BLOCK, cols), dtype=torch.uint8, device=device) if keep_along_rows else None
    grid = (triton.cdiv(rows, 32), triton.cdiv(cols, _DUAL_BLOCK_C), batches)
    placeholder = view
    _dual_kernel[grid](
        view, by_cols if along_cols else placeholder, by_rows if along_rows else placeholder,
        data if keep_along_rows else placeholder, scale if keep_along_rows else placeholder, rows, cols,
        *view.stride(), ALONG_COLS_VALUES=along_cols, ALONG_ROWS_VALUES=along_rows, ALONG_ROWS_MX=keep_along_rows,
        BLOCK_C=_DUAL_BLOCK_C, num_warps=4 if along_cols and along_rows and keep_along_rows else _DUAL_WARPS,
    )
    squeeze = values.dim() == 2
    if squeeze:
        by_cols = by_cols[0] if by_cols is not None else None
        by_rows = by_rows[0] if by_rows is not None else None
    mx = None
    if keep_along_rows:
        mx = MXTensor(data.transpose(-2, -1), scale.transpose(-2, -1))
        if squeeze:
            mx = MXTensor(mx.data[0], mx.scale[0])
    return by_cols, by_rows, mx


@triton.jit
def _dequantize_rows_kernel(data_ptr, scale_ptr, out_ptr, rows, cols, BLOCK_C: tl.constexpr):
    pid_r, pid_c, batch = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_r = pid_r * 32 + tl.arange(0, 32)
    offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (offs_r[:, None] < rows) & (offs_c[None, :] < cols)
    offsets = batch.to(tl.int64) * rows * cols + offs_r[:, None].to(tl.int64) * cols + offs_c[None, :]
    elements = tl.load(data_ptr + offsets, mask=mask, other=0.0)
    scale_offsets = batch.to(tl.int64) * (rows // 32) * cols + pid_r * cols + offs_c
    scales = tl.load(scale_ptr + scale_offsets, mask=offs_c < cols, other=127)
    values = elements.to(tl.float32) * scale_factor(scales)[None, :]
    tl.store(out_ptr + offsets, values.to(out_ptr.dtype.element_ty), mask=mask)


def dequantize_along_rows_triton(mx: MXTensor, dtype: torch.dtype) -> torch.Tensor:
    """Values (rows, cols) of the along-rows MXTensor made by mx_round_trip_triton(keep_along_rows=True)."""
    data, scale = mx.data.transpose(-2, -1), mx.scale.transpose(-2, -1)
    rows, cols = data.shape
    out = torch.empty((rows, cols), dtype=dtype, device=data.device)
    grid = (triton.cdiv(rows, 32), triton.cdiv(cols, _DEQUANT_BLOCK_C), 1)
    _dequantize_rows_kernel[grid](data, scale, out, rows, cols, BLOCK_C=_DEQUANT_BLOCK_C, num_warps=_DEQUANT_WARPS)
    return out
