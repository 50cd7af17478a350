"""The Triton kernels behind foldmill.kernels.triton_modulation (imports triton: load it lazily).

- `_adaptive_layer_norm_kernel`: BLOCK_R rows of a per program, LayerNorm statistics in fp32, then
  * scale + shift read from the record's row (rows of a are (record, sample, position); the terms
  are (record, position), so the samples of a record share them); with RESIDUAL it first adds
  gate * update to a (written back), the gated residual add that ends the previous sublayer.
- `_swiglu_product_kernel`: silu(gates) * x * y over a flat range of output elements.
- `_token_mean_kernel`: one program per (sample row, token, feature block) sums the token's atoms,
  which are contiguous, in a fixed order (deterministic, unlike atomics), times 1 / (count + 1e-6).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from foldmill.kernels.triton_support import padded_width

ELEMENTS_PER_PROGRAM = 4096  # adaptive LayerNorm: rows per program = this / padded width
SWIGLU_BLOCK = 1024
TOKEN_BLOCK_D = 256


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


@triton.jit(do_not_specialize=["elements"])
def _swiglu_product_kernel(h_ptr, out_ptr, elements, inner, h_row_stride, BLOCK: tl.constexpr):
    index = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = index < elements
    start = (index // inner) * h_row_stride + index % inner
    x = tl.load(h_ptr + start, mask=ok, other=0.0).to(tl.float32)
    gates = tl.load(h_ptr + start + inner, mask=ok, other=0.0).to(tl.float32)
    y = tl.load(h_ptr + start + 2 * inner, mask=ok, other=0.0).to(tl.float32)
    out = gates * tl.sigmoid(gates) * x * y
    tl.store(out_ptr + index, out.to(out_ptr.dtype.element_ty), mask=ok)


def swiglu_product(h: Tensor) -> Tensor:
    """See foldmill.model.layers.modulation.swiglu_product; `h` must be contiguous."""
    inner = h.shape[-1] // 3
    out = torch.empty((*h.shape[:-1], inner), device=h.device, dtype=h.dtype)
    elements = out.numel()
    _swiglu_product_kernel[(triton.cdiv(elements, SWIGLU_BLOCK),)](
        h, out, elements, inner, h.shape[-1], BLOCK=SWIGLU_BLOCK, num_warps=4
    )
    return out


@triton.jit
def _token_mean_kernel(
    x_ptr,
    start_ptr,
    inverse_count_ptr,
    out_ptr,
    samples,
    atoms,
    tokens,
    width,
    MAX_ATOMS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    sample_row = tl.program_id(0).to(tl.int64)
    token = tl.program_id(1)
    column = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    column_ok = column < width
    record = sample_row // samples
    first = tl.load(start_ptr + record * (tokens + 1) + token)
    end = tl.load(start_ptr + record * (tokens + 1) + token + 1)
    total = tl.zeros((BLOCK_D,), dtype=tl.float32)
    base = x_ptr + sample_row * atoms * width
    for offset in range(0, MAX_ATOMS):
        atom = first + offset
        value = tl.load(base + atom * width + column, mask=column_ok & (atom < end), other=0.0)
        total += value.to(tl.float32)
    weight = tl.load(inverse_count_ptr + record * tokens + token)
    out = out_ptr + (sample_row * tokens + token) * width + column
    tl.store(out, total * weight, mask=column_ok)


def token_mean(x: Tensor, starts: Tensor, inverse_counts: Tensor, samples: int, max_atoms: int) -> Tensor:
    """x: (B * samples, N, D) contiguous; starts: (B, T + 1) int32, a token's atoms being
    starts[t]:starts[t+1]; inverse_counts: (B, T) fp32 -> (B * samples, T, D) fp32."""
    rows, atoms, width = x.shape
    tokens = inverse_counts.shape[1]
    out = torch.empty((rows, tokens, width), device=x.device, dtype=torch.float32)
    grid = (rows, tokens, triton.cdiv(width, TOKEN_BLOCK_D))
    _token_mean_kernel[grid](
        x,
        starts,
        inverse_counts,
        out,
        samples,
        atoms,
        tokens,
        width,
        MAX_ATOMS=1 << (max(1, max_atoms) - 1).bit_length(),  # powers of two: few compilations
        BLOCK_D=TOKEN_BLOCK_D,
        num_warps=4,
    )
    return out
