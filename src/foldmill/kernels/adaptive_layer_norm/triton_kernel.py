"""The Triton kernels behind foldmill.kernels.adaptive_layer_norm.triton (imports triton: load it lazily).

- `_adaptive_layer_norm_kernel`: BLOCK_R rows of a per program, LayerNorm statistics in fp32, then
  * scale + shift read from the record's row (rows of a are (record, sample, position); the terms
  are (record, position), so the samples of a record share them); with RESIDUAL it first adds
  gate * update to a (written back), the gated residual add that ends the previous sublayer.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from foldmill.kernels.triton_support import padded_width

ELEMENTS_PER_PROGRAM = 4096  # adaptive LayerNorm: rows per program = this / padded width


@triton.jit(do_not_specialize=["rows"])
def _adaptive_layer_norm_kernel(
    a_ptr,
    gate_ptr,
    update_ptr,
    scale_ptr,
    shift_ptr,
    out_ptr,
    rows,
    length,
    rows_per_record,
    gate_record_stride,
    gate_row_stride,
    scale_record_stride,
    scale_row_stride,
    shift_record_stride,
    shift_row_stride,
    eps,
    WIDTH: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_R: tl.constexpr,
    RESIDUAL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    col = tl.arange(0, BLOCK_C)
    row_ok = row < rows
    col_ok = col < WIDTH
    mask = row_ok[:, None] & col_ok[None, :]
    record = row // rows_per_record
    position = row % length
    offsets = row[:, None] * WIDTH + col[None, :]
    x = tl.load(a_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    if RESIDUAL:  # a += gate * update, written back: the sublayer's residual add
        gate_start = record * gate_record_stride + position * gate_row_stride
        gate = tl.load(gate_ptr + gate_start[:, None] + col[None, :], mask=mask, other=0.0).to(tl.float32)
        x += gate * tl.load(update_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        tl.store(a_ptr + offsets, x, mask=mask)
    mean = tl.sum(x, axis=1) / WIDTH
    centred = tl.where(col_ok[None, :], x - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=1) / WIDTH + eps)
    scale_start = record * scale_record_stride + position * scale_row_stride
    shift_start = record * shift_record_stride + position * shift_row_stride
    scale = tl.load(scale_ptr + scale_start[:, None] + col[None, :], mask=mask, other=0.0).to(tl.float32)
    shift = tl.load(shift_ptr + shift_start[:, None] + col[None, :], mask=mask, other=0.0).to(tl.float32)
    y = centred * rstd[:, None] * scale + shift
    tl.store(out_ptr + offsets, y.to(out_ptr.dtype.element_ty), mask=mask)


def adaptive_layer_norm(
    a: Tensor,
    scale: Tensor,
    shift: Tensor,
    samples: int,
    eps: float,
    gate: Tensor | None = None,
    update: Tensor | None = None,
) -> Tensor:
    """See foldmill.model.layers.modulation.adaptive_layer_norm; with gate and update, first
    a += gate * update in place (modulation.residual_adaptive_layer_norm). a and update contiguous."""
    rows_total, length, width = a.shape
    out = torch.empty(a.shape, device=a.device, dtype=shift.dtype)
    rows = rows_total * length
    block_c = padded_width(width)
    block_r = max(1, ELEMENTS_PER_PROGRAM // block_c)
    residual = gate is not None
    gate_strides = (gate.stride(0), gate.stride(1)) if residual else (0, 0)
    _adaptive_layer_norm_kernel[(triton.cdiv(rows, block_r),)](
        a,
        gate if residual else a,  # never read without RESIDUAL
        update if residual else a,
        scale,
        shift,
        out,
        rows,
        length,
        samples * length,
        *gate_strides,
        scale.stride(0),
        scale.stride(1),
        shift.stride(0),
        shift.stride(1),
        eps,
        WIDTH=width,
        BLOCK_C=block_c,
        BLOCK_R=block_r,
        RESIDUAL=residual,
        num_warps=4,
    )
    return out
