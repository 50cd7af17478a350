"""Triton SwiGLU x routing weight, forward and backward, optionally writing the exact values of their
outputs' MXFP8 copies instead of the outputs (the MXFP8 backend on Hopper), so that no separate
round-trip pass reads them again.

forward:  a = silu(g) * u * p for h = [g | u] (rows, 2F), p (rows,)
backward: dg = da * p * u * silu'(g), du = da * p * silu(g), dp = sum_F da * silu(g) * u
The MXFP8 copies are those of a and of [dg | du] rounded to h's dtype, as the separate round trip
(mx_quant.mx_round_trip_triton) would make them, bit for bit.

When the MXFP8 backend stores the SwiGLU's input (`store_swiglu_input`), the forward kernel also
writes h's own MXFP8 copy (blocks along 2F, as mx_quant.quantize_mx_triton makes it) instead of a's
along-rows copy, and the backward reads h from that copy: the backward kernel, and the forward
kernel run again to give a's along-rows copy for the second GEMM's weight gradient.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from foldmill.moe.kernels.grid import cdiv
from foldmill.moe.kernels.mx_quant import load_mx_tile, require_blocks, store_mx_tile, store_round_trip
from foldmill.moe.quant.mx import BLOCK, MXTensor


@triton.jit
def _load_h(h_ptr, h_scale_ptr, offs_r, first_c, mask, rows, ffn, H_MX: tl.constexpr, BLOCK_R: tl.constexpr,
            BLOCK_F: tl.constexpr):
    """float32 (BLOCK_R, BLOCK_F) tile of h (rows, 2F) from column first_c (a multiple of 32) within
    the gate or the up half: h itself, or the values of its MXFP8 copy (E4M3 elements at h_ptr, one
    E8M0 scale per 32 columns at h_scale_ptr)."""
    if H_MX:
        half_end = (first_c // ffn + 1) * ffn
        values = load_mx_tile(h_ptr, h_scale_ptr, offs_r, first_c, rows, half_end, 2 * ffn, BLOCK_R, BLOCK_F)
    else:
        offs_c = first_c + tl.arange(0, BLOCK_F)
        values = tl.load(h_ptr + offs_r[:, None].to(tl.int64) * (2 * ffn) + offs_c[None, :], mask=mask, other=0.0)
        values = values.to(tl.float32)
    return values


@triton.jit
def _swiglu_forward_kernel(
    h_ptr, h_scale_ptr, p_ptr, a_ptr, by_rows_ptr, data_ptr, scale_ptr, h_data_ptr, h_scales_ptr, rows, ffn,
    H_MX: tl.constexpr, ALONG_COLS_VALUES: tl.constexpr, ALONG_ROWS_VALUES: tl.constexpr,
    ALONG_ROWS_MX: tl.constexpr, STORE_H_MX: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_F: tl.constexpr,
):
    # Without any MXFP8 output, a itself goes to a_ptr; otherwise store_round_trip's copies of a
    # (a_ptr: values along F, by_rows_ptr: values along the rows, data/scale: the along-rows copy).
    pid_r, pid_f = tl.program_id(0), tl.program_id(1)
    offs_r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_f = pid_f * BLOCK_F + tl.arange(0, BLOCK_F)
    mask = (offs_r[:, None] < rows) & (offs_f[None, :] < ffn)
    gate = _load_h(h_ptr, h_scale_ptr, offs_r, pid_f * BLOCK_F, mask, rows, ffn, H_MX, BLOCK_R, BLOCK_F)
    up = _load_h(h_ptr, h_scale_ptr, offs_r, pid_f * BLOCK_F + ffn, mask, rows, ffn, H_MX, BLOCK_R, BLOCK_F)
    p = tl.load(p_ptr + offs_r, mask=offs_r < rows, other=0.0).to(tl.float32)
    a = (gate * tl.sigmoid(gate) * up * p[:, None]).to(a_ptr.dtype.element_ty)
    out = offs_r[:, None].to(tl.int64) * ffn + offs_f[None, :]
    if ALONG_COLS_VALUES or ALONG_ROWS_VALUES or ALONG_ROWS_MX:
        store_round_trip(a.to(tl.float32), out, mask, a_ptr, by_rows_ptr, data_ptr, scale_ptr,
                         pid_r.to(tl.int64) * ffn + offs_f, offs_f < ffn, ALONG_COLS_VALUES, ALONG_ROWS_VALUES,
                         ALONG_ROWS_MX, BLOCK_F)
    else:
        tl.store(a_ptr + out, a, mask=mask)
    if STORE_H_MX:
        # Each half's tiles end at the half's end: the gate's last tile must not write into up's columns.
        store_mx_tile(gate, h_data_ptr, h_scales_ptr, offs_r, pid_f * BLOCK_F, rows, ffn, 2 * ffn, BLOCK_R, BLOCK_F)
        store_mx_tile(up, h_data_ptr, h_scales_ptr, offs_r, pid_f * BLOCK_F + ffn, rows, 2 * ffn, 2 * ffn,
                      BLOCK_R, BLOCK_F)


@triton.jit
def _swiglu_gradients(gate, up, da, p):
    """float32 (d_gate, d_up, the tile's share of dp) of a (rows, F) tile."""
    sigmoid = tl.sigmoid(gate)
    silu = gate * sigmoid
    d_up = da * p[:, None] * silu
    d_gate = da * p[:, None] * up * sigmoid * (1.0 + gate * (1.0 - sigmoid))
    return d_gate, d_up, tl.sum(da * silu * up, axis=1)


@triton.jit
def _swiglu_backward_kernel(
    h_ptr, p_ptr, da_ptr, dh_ptr, dp_ptr, rows, ffn, BLOCK_R: tl.constexpr, BLOCK_F: tl.constexpr,
):
    pid_r = tl.program_id(0)
    offs_r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    row_mask = offs_r < rows
    p = tl.load(p_ptr + offs_r, mask=row_mask, other=0.0).to(tl.float32)
    dp = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for start in range(0, ffn, BLOCK_F):
        offs_f = start + tl.arange(0, BLOCK_F)
        mask = row_mask[:, None] & (offs_f[None, :] < ffn)
        base = offs_r[:, None].to(tl.int64) * (2 * ffn) + offs_f[None, :]
        gate = tl.load(h_ptr + base, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(h_ptr + base + ffn, mask=mask, other=0.0).to(tl.float32)
        da = tl.load(da_ptr + offs_r[:, None].to(tl.int64) * ffn + offs_f[None, :], mask=mask, other=0.0)
        d_gate, d_up, dp_part = _swiglu_gradients(gate, up, da.to(tl.float32), p)
        dp += dp_part
        tl.store(dh_ptr + base, d_gate.to(dh_ptr.dtype.element_ty), mask=mask)
        tl.store(dh_ptr + base + ffn, d_up.to(dh_ptr.dtype.element_ty), mask=mask)
    tl.store(dp_ptr + offs_r, dp, mask=row_mask)


@triton.jit
def _swiglu_backward_mx_kernel(
    h_ptr, h_scale_ptr, p_ptr, da_ptr, by_cols_ptr, by_rows_ptr, dp_ptr, rows, ffn,
    H_MX: tl.constexpr, BLOCK_F: tl.constexpr,
):
    # One (32 rows, BLOCK_F) tile of the gate half and the same of the up half per program (a loop
    # over F would spill registers); each program writes its share of dp, summed by the caller.
    pid_r, pid_f = tl.program_id(0), tl.program_id(1)
    offs_r = pid_r * 32 + tl.arange(0, 32)
    offs_f = pid_f * BLOCK_F + tl.arange(0, BLOCK_F)
    mask = (offs_r[:, None] < rows) & (offs_f[None, :] < ffn)
    base = offs_r[:, None].to(tl.int64) * (2 * ffn) + offs_f[None, :]
    gate = _load_h(h_ptr, h_scale_ptr, offs_r, pid_f * BLOCK_F, mask, rows, ffn, H_MX, 32, BLOCK_F)
    up = _load_h(h_ptr, h_scale_ptr, offs_r, pid_f * BLOCK_F + ffn, mask, rows, ffn, H_MX, 32, BLOCK_F)
    da = tl.load(da_ptr + offs_r[:, None].to(tl.int64) * ffn + offs_f[None, :], mask=mask, other=0.0)
    p = tl.load(p_ptr + offs_r, mask=offs_r < rows, other=0.0).to(tl.float32)
    d_gate, d_up, dp_part = _swiglu_gradients(gate, up, da.to(tl.float32), p)
    tl.store(dp_ptr + pid_f.to(tl.int64) * rows + offs_r, dp_part, mask=offs_r < rows)
    # The copies are those of the gradient rounded to h's dtype, as the separate round trip reads it.
    d_gate = d_gate.to(by_cols_ptr.dtype.element_ty).to(tl.float32)
    store_round_trip(d_gate, base, mask, by_cols_ptr, by_rows_ptr, by_cols_ptr, by_cols_ptr, offs_f, offs_f < 0,
                     True, True, False, BLOCK_F)
    d_up = d_up.to(by_cols_ptr.dtype.element_ty).to(tl.float32)
    store_round_trip(d_up, base + ffn, mask, by_cols_ptr, by_rows_ptr, by_cols_ptr, by_cols_ptr, offs_f, offs_f < 0,
                     True, True, False, BLOCK_F)


# Launch settings of the MXFP8-writing kernels, measured on the H200 in CUDA graphs among 32-256
# columns on 1-8 warps: forward 0.152 ms at bio_8x1b's shape (16,384 rows, F 4,096) and 0.529 at
# Mixtral-8x7B's (F 14,336) with 64 columns on two warps (plain SwiGLU 0.104 and 0.356; 0.237
# and 0.838 when the copies were rounded in float32 arithmetic); backward 0.307 and 1.068 ms with
# 64 columns on four warps (plain 0.180 and 0.604; 0.436 and 1.512 before). `foldmill bench moe
# --sections kernels` times the chosen settings. Reading h from its MXFP8 copy, the backward was
# again fastest with 64 columns on four warps among 32-128 columns on 2-8 warps (H100: 0.369 ms at
# bio_8x1b's shape, 1.296 at Mixtral-8x7B's).
_MX_FORWARD_BLOCK_F, _MX_FORWARD_WARPS = 64, 2
_MX_BACKWARD_BLOCK_F, _MX_BACKWARD_WARPS = 64, 4


def swiglu_forward_triton(h: torch.Tensor, row_probs: torch.Tensor) -> torch.Tensor:
    """a (rows, F) in h's dtype."""
    h = h.contiguous()
    rows, ffn = h.shape[0], h.shape[1] // 2
    a = torch.empty((rows, ffn), dtype=h.dtype, device=h.device)
    grid = (cdiv(rows, 32), cdiv(ffn, 128))
    _swiglu_forward_kernel[grid](h, h, row_probs.contiguous(), a, a, a, a, a, a, rows, ffn, H_MX=False,
                                 ALONG_COLS_VALUES=False, ALONG_ROWS_VALUES=False, ALONG_ROWS_MX=False,
                                 STORE_H_MX=False, BLOCK_R=32, BLOCK_F=128, num_warps=4)
    return a


def swiglu_forward_mx_triton(
    h: torch.Tensor, row_probs: torch.Tensor, store_input: bool = False
) -> tuple[torch.Tensor, MXTensor]:
    """(exact values of a's MXFP8 copy with blocks along F, in h's dtype; a's along-rows MXFP8 copy,
    an MXTensor of a's transposed view, or with `store_input` h's MXFP8 copy with blocks along 2F
    instead), without writing a itself."""
    h = h.contiguous()
    rows, ffn = h.shape[0], h.shape[1] // 2
    require_blocks((rows, ffn), blocks_along_rows=True)
    values = torch.empty((rows, ffn), dtype=h.dtype, device=h.device)
    if store_input:
        data = torch.empty_like(h, dtype=torch.float8_e4m3fn)
        scale = torch.empty((rows, 2 * ffn // BLOCK), dtype=torch.uint8, device=h.device)
        outputs = {"data_ptr": values, "scale_ptr": values, "h_data_ptr": data, "h_scales_ptr": scale}
    else:
        data = torch.empty((rows, ffn), dtype=torch.float8_e4m3fn, device=h.device)
        scale = torch.empty((rows // BLOCK, ffn), dtype=torch.uint8, device=h.device)
        outputs = {"data_ptr": data, "scale_ptr": scale, "h_data_ptr": values, "h_scales_ptr": values}
    grid = (rows // 32, cdiv(ffn, _MX_FORWARD_BLOCK_F))
    _swiglu_forward_kernel[grid](h, h, row_probs.contiguous(), values, values, **outputs, rows=rows, ffn=ffn,
                                 H_MX=False, ALONG_COLS_VALUES=True, ALONG_ROWS_VALUES=False,
                                 ALONG_ROWS_MX=not store_input, STORE_H_MX=store_input, BLOCK_R=32,
                                 BLOCK_F=_MX_FORWARD_BLOCK_F, num_warps=_MX_FORWARD_WARPS)
    return values, MXTensor(data, scale) if store_input else MXTensor(data.t(), scale.t())


def swiglu_along_rows_from_stored_triton(
    h: MXTensor, row_probs: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """Exact values (rows, F), as `dtype`, of the along-rows MXFP8 copy of a = SwiGLU(h, p) computed
    from h's MXFP8 copy (blocks along 2F): the second GEMM's weight-gradient operand."""
    rows, ffn = h.data.shape[0], h.data.shape[1] // 2
    require_blocks((rows, ffn), blocks_along_rows=True)
    by_rows = torch.empty((rows, ffn), dtype=dtype, device=h.data.device)
    grid = (rows // 32, cdiv(ffn, _MX_FORWARD_BLOCK_F))
    _swiglu_forward_kernel[grid](h.data, h.scale, row_probs.contiguous(), by_rows, by_rows, by_rows, by_rows,
                                 by_rows, by_rows, rows, ffn, H_MX=True, ALONG_COLS_VALUES=False,
                                 ALONG_ROWS_VALUES=True, ALONG_ROWS_MX=False, STORE_H_MX=False, BLOCK_R=32,
                                 BLOCK_F=_MX_FORWARD_BLOCK_F, num_warps=_MX_FORWARD_WARPS)
    return by_rows


def swiglu_backward_triton(
    h: torch.Tensor, row_probs: torch.Tensor, grad_a: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_h (rows, 2F) in h's dtype, grad_row_probs (rows,) float32)."""
    h, grad_a = h.contiguous(), grad_a.contiguous()
    rows, ffn = h.shape[0], h.shape[1] // 2
    grad_h = torch.empty_like(h)
    grad_p = torch.empty(rows, dtype=torch.float32, device=h.device)
    _swiglu_backward_kernel[(cdiv(rows, 16),)](h, row_probs.contiguous(), grad_a, grad_h, grad_p, rows, ffn,
                                               BLOCK_R=16, BLOCK_F=128, num_warps=4)
    return grad_h, grad_p


def swiglu_backward_mx_triton(
    h: torch.Tensor | MXTensor, row_probs: torch.Tensor, grad_a: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(exact values of grad_h's MXFP8 copies with blocks along 2F and along the rows, both (rows, 2F)
    in grad_a's dtype; grad_row_probs (rows,) float32), without writing grad_h itself. h is the
    SwiGLU's input or its MXFP8 copy (blocks along 2F)."""
    h_mx = isinstance(h, MXTensor)
    h_data, h_scale = (h.data, h.scale) if h_mx else (h.contiguous(), None)
    grad_a = grad_a.contiguous()
    rows, ffn = h_data.shape[0], h_data.shape[1] // 2
    require_blocks((rows, ffn), blocks_along_rows=True)
    along_cols = torch.empty(h_data.shape, dtype=grad_a.dtype, device=grad_a.device)
    along_rows = torch.empty_like(along_cols)
    chunks = cdiv(ffn, _MX_BACKWARD_BLOCK_F)
    grad_p_parts = torch.empty((chunks, rows), dtype=torch.float32, device=grad_a.device)
    _swiglu_backward_mx_kernel[(rows // 32, chunks)](h_data, h_scale if h_mx else h_data, row_probs.contiguous(),
                                                     grad_a, along_cols, along_rows, grad_p_parts, rows, ffn,
                                                     H_MX=h_mx, BLOCK_F=_MX_BACKWARD_BLOCK_F,
                                                     num_warps=_MX_BACKWARD_WARPS)
    return along_cols, along_rows, grad_p_parts.sum(0)

