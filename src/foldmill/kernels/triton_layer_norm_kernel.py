"""The Triton kernel behind foldmill.kernels.triton_layer_norm (imports triton: load it lazily).

Rows are addressed as (outer, inner) pairs with one stride each, so a contiguous tensor and the
transposed pair view (B=1, N, N, C).transpose(1, 2) are both read in place. One program
normalises BLOCK_R rows of BLOCK_C (the width padded to a power of two, masked) in fp32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from foldmill.kernels.triton_layer_norm import row_layout
from foldmill.kernels.triton_support import padded_width

ELEMENTS_PER_PROGRAM = 4096  # rows per program = this / padded width: 32 pair rows of 128


# Strides stay specialised (Triton keys on their divisibility by 16, not their values): aligned row
# starts let the compiler vectorise the loads.
@triton.jit(do_not_specialize=["rows"])
def _layer_norm_kernel(
    x_ptr,
    weight_ptr,
    bias_ptr,
    out_ptr,
    rows,
    inner,
    outer_stride,
    inner_stride,
    eps,
    WIDTH: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_R: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)  # 64-bit: N*N*C > 2^31
    col = tl.arange(0, BLOCK_C)
    row_ok = row < rows
    col_ok = col < WIDTH
    mask = row_ok[:, None] & col_ok[None, :]
    start = (row // inner) * outer_stride + (row % inner) * inner_stride
    x = tl.load(x_ptr + start[:, None] + col[None, :], mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=1) / WIDTH
    centred = tl.where(col_ok[None, :], x - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=1) / WIDTH + eps)
    y = centred * rstd[:, None]
    if HAS_WEIGHT:
        y = y * tl.load(weight_ptr + col, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if HAS_BIAS:
        y = y + tl.load(bias_ptr + col, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + row[:, None] * WIDTH + col[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


def fused_layer_norm(
    x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, out_dtype: torch.dtype
) -> Tensor:
    """LayerNorm of the last axis in fp32, result contiguous in `out_dtype`."""
    width = x.shape[-1]
    out = torch.empty(x.shape, device=x.device, dtype=out_dtype)
    rows = out.numel() // width
    source, inner, outer_stride, inner_stride = row_layout(x)
    block_c = padded_width(width)
    block_r = max(1, ELEMENTS_PER_PROGRAM // block_c)
    _layer_norm_kernel[(triton.cdiv(rows, block_r),)](
        source,
        weight if weight is not None else out,  # never read without HAS_WEIGHT
        bias if bias is not None else out,
        out,
        rows,
        inner,
        outer_stride,
        inner_stride,
        eps,
        WIDTH=width,
        BLOCK_C=block_c,
        BLOCK_R=block_r,
        HAS_WEIGHT=weight is not None,
        HAS_BIAS=bias is not None,
        num_warps=4,
    )
    return out
