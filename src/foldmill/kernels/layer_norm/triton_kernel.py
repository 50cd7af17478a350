"""The Triton kernels behind foldmill.kernels.layer_norm.triton (imports triton: load them lazily).

Rows are addressed as (outer, inner) pairs with one stride each, so a contiguous tensor and the
transposed pair view (B=1, N, N, C).transpose(1, 2) are both read in place. One program
normalises BLOCK_R rows of BLOCK_C (the width padded to a power of two, masked) in fp32.
`_layer_norm_heads_kernel` also projects each normalised row to a few heads (an attention's pair bias)
and stores them heads first, so the pair is read once for the norm and the bias.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from foldmill.kernels.layer_norm.triton import HEAD_BLOCK, row_layout
from foldmill.kernels.triton_dot_operands import dot_operand, rounded
from foldmill.kernels.triton_support import dot_flags, padded_width

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




@triton.jit
def affine_layer_norm(x, col, eps, weight_ptr, bias_ptr, C: tl.constexpr):
    """The fp32 LayerNorm (weight and bias) of each row of an fp32 (rows, C) tile, C a power of two (col:
    tl.arange(0, C)); the triangle multiplication's kernels use it too."""
    mean = tl.sum(x, axis=1) / C
    centred = x - mean[:, None]
    rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=1) / C + eps)
    weight = tl.load(weight_ptr + col).to(tl.float32)
    bias = tl.load(bias_ptr + col).to(tl.float32)
    return centred * rstd[:, None] * weight[None, :] + bias[None, :]


@triton.jit(do_not_specialize=["rows", "plane"])
def _layer_norm_heads_kernel(
    x_ptr,
    weight_ptr,
    bias_ptr,
    head_weight_ptr,
    normed_ptr,
    heads_ptr,
    rows,
    plane,
    inner,
    outer_stride,
    inner_stride,
    eps,
    WIDTH: tl.constexpr,
    HEADS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_R: tl.constexpr,
    KEEP_NORMED: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    EMULATE_BF16: tl.constexpr,
):
    """LayerNorm (weight and bias) of BLOCK_R rows of WIDTH (a power of two), rounded to the compute dtype
    (stored when KEEP_NORMED), projected to HEADS heads (fp32 accumulation, rounded) and stored heads first:
    row r = (b, i, j) of `plane` rows per batch element goes to heads[b, h, i, j]."""
    row = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)  # 64-bit: N*N*C > 2^31
    col = tl.arange(0, WIDTH)
    row_ok = row < rows
    dtype = heads_ptr.dtype.element_ty  # the compute dtype
    start = (row // inner) * outer_stride + (row % inner) * inner_stride
    x = tl.load(x_ptr + start[:, None] + col[None, :], mask=row_ok[:, None], other=0.0).to(tl.float32)
    normed = rounded(affine_layer_norm(x, col, eps, weight_ptr, bias_ptr, WIDTH), dtype, EMULATE_BF16)
    if KEEP_NORMED:
        tl.store(normed_ptr + row[:, None] * WIDTH + col[None, :], normed.to(dtype), mask=row_ok[:, None])
    head = tl.arange(0, BLOCK_H)
    head_ok = head < HEADS
    head_weight_t = tl.load(head_weight_ptr + head[None, :] * WIDTH + col[:, None], mask=head_ok[None, :], other=0.0)
    heads = tl.dot(normed, dot_operand(head_weight_t, EMULATE_BF16), input_precision=DOT_PRECISION)
    heads = rounded(heads, dtype, EMULATE_BF16).to(dtype)  # 2nd cast: interpreter only
    out = heads_ptr + (row // plane)[:, None] * (HEADS * plane) + head[None, :] * plane + (row % plane)[:, None]
    tl.store(out, heads, mask=row_ok[:, None] & head_ok[None, :])


def fused_layer_norm_heads(
    x: Tensor, weight: Tensor, bias: Tensor, eps: float, head_weight: Tensor, out_dtype: torch.dtype, keep_normed: bool
) -> tuple[Tensor | None, Tensor]:
    """(LayerNorm of x (B, I, J, C) in `out_dtype`, contiguous, or None without keep_normed; its projection
    by head_weight (H, C), (B, H, I, J) contiguous in `out_dtype`). C: a power of two; H <= HEAD_BLOCK."""
    batch, rows_i, cols_j, width = x.shape
    heads_count = head_weight.shape[0]
    heads = torch.empty(batch, heads_count, rows_i, cols_j, device=x.device, dtype=out_dtype)
    normed = torch.empty(x.shape, device=x.device, dtype=out_dtype) if keep_normed else None
    source, inner, outer_stride, inner_stride = row_layout(x)
    rows = batch * rows_i * cols_j
    if rows == 0:
        return normed, heads
    block_r = max(1, ELEMENTS_PER_PROGRAM // width)
    _layer_norm_heads_kernel[(triton.cdiv(rows, block_r),)](
        source, weight, bias, head_weight.to(out_dtype).contiguous(), heads if normed is None else normed, heads,
        rows, rows_i * cols_j, inner, outer_stride, inner_stride, eps,
        WIDTH=width, HEADS=heads_count, BLOCK_H=HEAD_BLOCK, BLOCK_R=block_r, KEEP_NORMED=keep_normed,
        **dot_flags(x.device, out_dtype), num_warps=4,
    )  # fmt: skip
    return normed, heads
