"""Triton MXFP8 quantizer: E4M3 elements, RCEIL E8M0 scale per 32 values along the last dimension.

Same rules as quant/mx_reference.py, bit for bit: exponent from the block maximum's bits
(e = exp(amax) - 8, plus one when amax's mantissa exceeds 1.75 = 448 / 2^8; clamped at -127);
elements x * 2^-e, which is exact, then one round to nearest even onto the E4M3 grid; blocks
holding NaN or Inf become scale 0xFF with NaN elements. Reads any strides (so transposed copies for dgrad and wgrad
are quantized straight from the bf16 tensor), writes contiguous data and scales.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from foldmill.moe.kernels.grid import cdiv
from foldmill.moe.quant.mx import BLOCK, MXTensor


@triton.jit
def _rceil_exponent(bits):
    """RCEIL scale exponent (int32) of non-negative finite float32 block maxima given by their bits
    (int32), clamped at -127."""
    exponent_field = bits >> 23
    mantissa_above = ((bits & 0x7FFFFF) > 0x600000).to(tl.int32)
    exponent = tl.where(exponent_field == 0, -127, exponent_field - 135 + mantissa_above)
    return tl.maximum(exponent, -127)


@triton.jit
def block_exponent(values, AXIS: tl.constexpr):
    """RCEIL exponents (int32) of the 32-value blocks along AXIS, and whether each block is finite.

    The block maximum is taken over the magnitudes' bits as integers, which order like the values;
    NaN and Inf have the largest bits, so one reduction also tells whether the block is finite."""
    amax_bits = tl.max(values.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=AXIS)
    return _rceil_exponent(amax_bits), amax_bits < 0x7F800000


@triton.jit
def scale_factor(scales):
    """E8M0 bytes -> float32 2^(byte - 127); 0 is the subnormal 2^-127, 255 is NaN."""
    factor = (scales.to(tl.int32) << 23).to(tl.float32, bitcast=True)
    factor = tl.where(scales == 0, 5.877471754111438e-39, factor)
    return tl.where(scales == 255, float("nan"), factor)


@triton.jit
def round_to_e4m3(y):
    """float32 y (|y| <= 448 or NaN) rounded to the nearest E4M3 value, ties to even, sign of zero
    kept, NaN staying NaN, as float32: the hardware conversion to E4M3 pairs and back to half
    precision (sm_89+). Written as PTX because going through Triton's float8 type
    (`y.to(tl.float8e4nv).to(tl.float32)`) gave wrong values on sm_90 in some tile layouts."""
    return tl.inline_asm_elementwise(
        asm="""{
        .reg .b16 pair, lo, hi;
        .reg .b32 halves;
        cvt.rn.satfinite.e4m3x2.f32 pair, $3, $2;
        cvt.rn.f16x2.e4m3x2 halves, pair;
        mov.b32 {lo, hi}, halves;
        cvt.f32.f16 $0, lo;
        cvt.f32.f16 $1, hi;
        }""",
        constraints="=r,=r,r,r", args=[y], dtype=tl.float32, is_pure=True, pack=2,
    )


@triton.jit
def exact_mx_values(values, exponent, finite):
    """(exact float32 values of the E4M3 elements of values * 2^-e times 2^e, those elements as float32).

    `exponent` and `finite` broadcast against `values`. values * 2^-e is exact and within +-448 (RCEIL),
    so rounding it onto the E4M3 grid is the only rounding. A block that is not finite is scaled
    by NaN, so all its elements are NaN.
    """
    inverse = tl.where(finite, ((127 - exponent) << 23).to(tl.float32, bitcast=True), float("nan"))
    elements = round_to_e4m3(values * inverse)
    return elements * scale_factor(exponent + 127), elements


@triton.jit
def mx_quantize_blocks(values):
    """values (rows, blocks, 32) float32 -> (float8e4nv elements, uint8 scales (rows, blocks))."""
    exponent, finite = block_exponent(values, 2)
    _, elements = exact_mx_values(values, exponent[:, :, None], finite[:, :, None])
    return elements.to(tl.float8e4nv), tl.where(finite, exponent + 127, 255).to(tl.uint8)


@triton.jit
def store_mx_tile(values, data_ptr, scale_ptr, offs_r, first_c, rows, col_end, cols,
                  BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """Quantize a float32 (BLOCK_R, BLOCK_C) tile whose first column first_c is a multiple of 32 into
    32-wide blocks along its columns, and store it into a row-major (rows, cols) MXFP8 tensor
    (elements at data_ptr, scales at scale_ptr), leaving out rows >= rows and columns >= col_end."""
    elements, scales = mx_quantize_blocks(tl.reshape(values, (BLOCK_R, BLOCK_C // 32, 32)))
    row_mask = offs_r[:, None] < rows
    offs_c = first_c + tl.arange(0, BLOCK_C)
    tl.store(data_ptr + offs_r[:, None].to(tl.int64) * cols + offs_c[None, :],
             tl.reshape(elements, (BLOCK_R, BLOCK_C)), mask=row_mask & (offs_c[None, :] < col_end))
    offs_s = first_c // 32 + tl.arange(0, BLOCK_C // 32)
    tl.store(scale_ptr + offs_r[:, None].to(tl.int64) * (cols // 32) + offs_s[None, :], scales,
             mask=row_mask & (offs_s[None, :] < col_end // 32))


@triton.jit
def load_mx_tile(data_ptr, scale_ptr, offs_r, first_c, rows, col_end, cols,
                 BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """float32 values of the (BLOCK_R, BLOCK_C) tile from column first_c (a multiple of 32) of a
    row-major (rows, cols) MXFP8 tensor as store_mx_tile writes it; rows >= rows and columns >=
    col_end read as 0. One scale load per block, broadcast over its 32 values: a load per value made
    the SwiGLU backward about three times slower."""
    row_mask = offs_r[:, None] < rows
    offs_c = first_c + tl.arange(0, BLOCK_C)
    elements = tl.load(data_ptr + offs_r[:, None].to(tl.int64) * cols + offs_c[None, :],
                       mask=row_mask & (offs_c[None, :] < col_end), other=0.0)
    offs_s = first_c // 32 + tl.arange(0, BLOCK_C // 32)
    scales = tl.load(scale_ptr + offs_r[:, None].to(tl.int64) * (cols // 32) + offs_s[None, :],
                     mask=row_mask & (offs_s[None, :] < col_end // 32), other=127)
    blocks = tl.reshape(elements.to(tl.float32), (BLOCK_R, BLOCK_C // 32, 32)) * scale_factor(scales)[:, :, None]
    return tl.reshape(blocks, (BLOCK_R, BLOCK_C))


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
    store_mx_tile(values, data_ptr + batch * rows * cols, scale_ptr + batch * rows * (cols // 32), offs_r,
                  pid_c * BLOCK_C, rows, cols, cols, BLOCK_R, BLOCK_C)


def quantize_mx_triton(values: torch.Tensor) -> MXTensor:
    """MXFP8 of a 2-D or 3-D CUDA tensor (any strides) along its last dimension."""
    if values.shape[-1] % BLOCK:
        raise ValueError(f"MXFP8 needs the last dimension to be a multiple of {BLOCK}, got {values.shape[-1]}")
    view = values if values.dim() == 3 else values.unsqueeze(0)
    batches, rows, cols = view.shape
    data = torch.empty(view.shape, dtype=torch.float8_e4m3fn, device=values.device)
    scale = torch.empty((batches, rows, cols // BLOCK), dtype=torch.uint8, device=values.device)
    block_r, block_c = 32, 128
    grid = (cdiv(rows, block_r), cdiv(cols, block_c), batches)
    _quantize_kernel[grid](view, data, scale, rows, cols, *view.stride(), BLOCK_R=block_r, BLOCK_C=block_c,
                           num_warps=4)
    if values.dim() == 2:
        data, scale = data[0], scale[0]
    return MXTensor(data, scale)


@triton.jit
def store_round_trip(
    values, out, mask, by_cols_ptr, by_rows_ptr, mx_data_ptr, mx_scale_ptr, scale_offsets, scale_mask,
    ALONG_COLS_VALUES: tl.constexpr, ALONG_ROWS_VALUES: tl.constexpr, ALONG_ROWS_MX: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Store the MXFP8 copies of one float32 tile of 32 rows (the first on a multiple of 32) x BLOCK_C
    columns: exact values with blocks along the columns and/or along the rows at `out`, and the
    along-rows elements and scales themselves. Shared by the round trip and by the kernels that
    produce the operands (SwiGLU forward and backward), which so never write the plain tensor."""
    if ALONG_COLS_VALUES:
        blocks = tl.reshape(values, (32, BLOCK_C // 32, 32))
        exponent, finite = block_exponent(blocks, 2)
        exact, _ = exact_mx_values(blocks, exponent[:, :, None], finite[:, :, None])
        tl.store(by_cols_ptr + out, tl.reshape(exact, (32, BLOCK_C)).to(by_cols_ptr.dtype.element_ty), mask=mask)
    if ALONG_ROWS_VALUES or ALONG_ROWS_MX:
        exponent, finite = block_exponent(values, 0)
        exact, elements = exact_mx_values(values, exponent[None, :], finite[None, :])
        if ALONG_ROWS_VALUES:
            tl.store(by_rows_ptr + out, exact.to(by_rows_ptr.dtype.element_ty), mask=mask)
        if ALONG_ROWS_MX:
            tl.store(mx_data_ptr + out, elements.to(tl.float8e4nv), mask=mask)
            tl.store(mx_scale_ptr + scale_offsets, tl.where(finite, exponent + 127, 255).to(tl.uint8), mask=scale_mask)


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
    scale_offsets = batch.to(tl.int64) * (rows // 32) * cols + pid_r * cols + offs_c
    store_round_trip(values, out, mask, by_cols_ptr, by_rows_ptr, mx_data_ptr, mx_scale_ptr, scale_offsets,
                     offs_c < cols, ALONG_COLS_VALUES, ALONG_ROWS_VALUES, ALONG_ROWS_MX, BLOCK_C)


def require_blocks(shape: tuple[int, ...], blocks_along_rows: bool) -> None:
    """MXFP8 copies block the last dimension by 32, and the second-last too when `blocks_along_rows`."""
    if shape[-1] % BLOCK or (blocks_along_rows and shape[-2] % BLOCK):
        raise ValueError(f"MXFP8 blocks of {BLOCK} need both dimensions to be multiples of {BLOCK}, "
                         f"got {tuple(shape)}")


# Columns per 32-row program and warps, measured on the H200 in CUDA graphs at bio_8x1b's operand
# shapes among 32-128 columns on 1-4 warps, keeping those that compile without spills for any
# strides (tests/test_moe_lowp.py): an input's copies (x, 16,384 x 2,048: values along the columns
# and the kept along-rows copy) 0.057 ms with 64 columns on two warps (0.106 before the rounding
# moved to the hardware conversion); a gradient's or a weight's (values both ways) 0.054 ms for dy
# (16,384 x 2,048, 0.075 before) and 0.204 for w13 (8 x 8,192 x 2,048, 0.286 before) with 128
# columns on four warps; a bf16 copy of dy takes 0.034. All three outputs at once (tests only) take
# 64 columns on four warps, which do not spill. The dequantization: 0.029 ms for x's kept copy with
# 256 columns on two warps (64-512 columns on 1-8 warps within 4%). `foldmill bench moe --sections
# kernels` times the chosen settings.
_INPUT_BLOCK_C, _INPUT_WARPS = 64, 2
_BOTH_WAYS_BLOCK_C, _BOTH_WAYS_WARPS = 128, 4
_ALL_THREE_BLOCK_C, _ALL_THREE_WARPS = 64, 4
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
    require_blocks(view.shape, blocks_along_rows=along_rows or keep_along_rows)
    device = values.device
    by_cols = torch.empty(view.shape, dtype=dtype, device=device) if along_cols else None
    by_rows = torch.empty(view.shape, dtype=dtype, device=device) if along_rows else None
    data = torch.empty(view.shape, dtype=torch.float8_e4m3fn, device=device) if keep_along_rows else None
    scale = torch.empty((batches, rows // BLOCK, cols), dtype=torch.uint8, device=device) if keep_along_rows else None
    if along_rows and keep_along_rows:
        block_c, warps = _ALL_THREE_BLOCK_C, _ALL_THREE_WARPS
    elif along_rows:
        block_c, warps = _BOTH_WAYS_BLOCK_C, _BOTH_WAYS_WARPS
    else:
        block_c, warps = _INPUT_BLOCK_C, _INPUT_WARPS
    grid = (cdiv(rows, 32), cdiv(cols, block_c), batches)
    placeholder = view
    _dual_kernel[grid](
        view, by_cols if along_cols else placeholder, by_rows if along_rows else placeholder,
        data if keep_along_rows else placeholder, scale if keep_along_rows else placeholder, rows, cols,
        *view.stride(), ALONG_COLS_VALUES=along_cols, ALONG_ROWS_VALUES=along_rows, ALONG_ROWS_MX=keep_along_rows,
        BLOCK_C=block_c, num_warps=warps,
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
    grid = (cdiv(rows, 32), cdiv(cols, _DEQUANT_BLOCK_C), 1)
    _dequantize_rows_kernel[grid](data, scale, out, rows, cols, BLOCK_C=_DEQUANT_BLOCK_C, num_warps=_DEQUANT_WARPS)
    return out
