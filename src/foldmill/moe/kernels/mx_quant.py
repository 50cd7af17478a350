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
def mx_quantize_blocks(values):
    """values (rows, blocks, 32) float32 -> (float8e4nv elements, uint8 scales (rows, blocks))."""
    finite = values == values
    finite = finite & (tl.abs(values) != float("inf"))
    block_finite = tl.min(finite.to(tl.int32), axis=2) == 1
    amax = tl.max(tl.where(finite, tl.abs(values), 0.0), axis=2)
    bits = amax.to(tl.int32, bitcast=True)
    exponent_field = bits >> 23
    mantissa_above = ((bits & 0x7FFFFF) > 0x600000).to(tl.int32)
    exponent = tl.where(exponent_field == 0, -127, exponent_field - 135 + mantissa_above)
    exponent = tl.maximum(exponent, -127)
    inverse = ((127 - exponent) << 23).to(tl.float32, bitcast=True)
    scaled = values * inverse[:, :, None]
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
