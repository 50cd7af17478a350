"""Triton SwiGLU x routing weight, optionally emitting the MXFP8 copy of its output (blocks along F).

forward:  a = silu(g) * u * p for h = [g | u] (rows, 2F), p (rows,)
backward: dg = da * p * u * silu'(g), du = da * p * silu(g), dp = sum_F da * silu(g) * u
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from foldmill.moe.kernels.mx_quant import mx_quantize_blocks
from foldmill.moe.quant.mx import BLOCK, MXTensor


@triton.jit
def _swiglu_forward_kernel(
    h_ptr, p_ptr, a_ptr, data_ptr, scale_ptr, rows, ffn,
    QUANTIZE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_F: tl.constexpr,
):
    pid_r, pid_f = tl.program_id(0), tl.program_id(1)
    offs_r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_f = pid_f * BLOCK_F + tl.arange(0, BLOCK_F)
    mask = (offs_r[:, None] < rows) & (offs_f[None, :] < ffn)
    base = offs_r[:, None].to(tl.int64) * (2 * ffn) + offs_f[None, :]
    gate = tl.load(h_ptr + base, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(h_ptr + base + ffn, mask=mask, other=0.0).to(tl.float32)
    p = tl.load(p_ptr + offs_r, mask=offs_r < rows, other=0.0).to(tl.float32)
    a = gate * tl.sigmoid(gate) * up * p[:, None]
    a = a.to(a_ptr.dtype.element_ty)
    out = offs_r[:, None].to(tl.int64) * ffn + offs_f[None, :]
    tl.store(a_ptr + out, a, mask=mask)
    if QUANTIZE:
        elements, scales = mx_quantize_blocks(tl.reshape(a.to(tl.float32), (BLOCK_R, BLOCK_F // 32, 32)))
        tl.store(data_ptr + out, tl.reshape(elements, (BLOCK_R, BLOCK_F)), mask=mask)
        offs_s = pid_f * (BLOCK_F // 32) + tl.arange(0, BLOCK_F // 32)
        scale_mask = (offs_r[:, None] < rows) & (offs_s[None, :] < ffn // 32)
        tl.store(scale_ptr + offs_r[:, None].to(tl.int64) * (ffn // 32) + offs_s[None, :], scales, mask=scale_mask)


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
        da = da.to(tl.float32)
        sigmoid = tl.sigmoid(gate)
        silu = gate * sigmoid
        d_up = da * p[:, None] * silu
        d_gate = da * p[:, None] * up * sigmoid * (1.0 + gate * (1.0 - sigmoid))
        dp += tl.sum(da * silu * up, axis=1)
        tl.store(dh_ptr + base, d_gate.to(dh_ptr.dtype.element_ty), mask=mask)
        tl.store(dh_ptr + base + ffn, d_up.to(dh_ptr.dtype.element_ty), mask=mask)
    tl.store(dp_ptr + offs_r, dp, mask=row_mask)


def swiglu_forward_triton(h: torch.Tensor, row_probs: torch.Tensor, quantize: bool) -> tuple[torch.Tensor, MXTensor | None]:
    h = h.contiguous()
    rows, ffn = h.shape[0], h.shape[1] // 2
    a = torch.empty((rows, ffn), dtype=h.dtype, device=h.device)
    if quantize:
        if ffn % BLOCK:
            raise ValueError(f"MXFP8 needs the expert FFN size to be a multiple of {BLOCK}, got {ffn}")
        data = torch.empty((rows, ffn), dtype=torch.float8_e4m3fn, device=h.device)
        scale = torch.empty((rows, ffn // BLOCK), dtype=torch.uint8, device=h.device)
    else:
        data, scale = a, a
    block_r, block_f = 32, 128
    grid = (triton.cdiv(rows, block_r), triton.cdiv(ffn, block_f))
    _swiglu_forward_kernel[grid](h, row_probs.contiguous(), a, data, scale, rows, ffn, QUANTIZE=quantize,
                                 BLOCK_R=block_r, BLOCK_F=block_f, num_warps=4)
    return a, (MXTensor(data, scale) if quantize else None)


def swiglu_backward_triton(h: torch.Tensor, row_probs: torch.Tensor, grad_a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    h, grad_a = h.contiguous(), grad_a.contiguous()
    rows, ffn = h.shape[0], h.shape[1] // 2
    grad_h = torch.empty_like(h)
    grad_p = torch.empty(rows, dtype=torch.float32, device=h.device)
    block_r = 16
    _swiglu_backward_kernel[(triton.cdiv(rows, block_r),)](h, row_probs.contiguous(), grad_a, grad_h, grad_p, rows,
                                                           ffn, BLOCK_R=block_r, BLOCK_F=128, num_warps=4)
    return grad_h, grad_p
