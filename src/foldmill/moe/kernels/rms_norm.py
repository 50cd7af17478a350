"""Residual add + RMSNorm, forward and backward in one Triton kernel each.

In a pre-norm decoder every norm reads the residual stream right after a branch's output was added
to it: h = x + delta, y = rmsnorm(h) * weight. Eager, that is an add (two reads, one write), the norm
(one read, one write) and, in the backward pass, the norm's input gradient, a second pass for the
weight gradient and the add of the residual path's gradient. Fused, the forward pass reads x and
delta once and writes h and y; the backward pass reads dy, h and the residual gradient once, writes
the gradient of x (which is also delta's) and per-program partial sums of the weight gradient.
Sums and the normalization run in float32; h is rounded to x's dtype before it is normalized, as
the eager add does. Under the bf16-mixed recipe the stream x is float32 and delta (a branch's
output) bf16: h and y are float32 and delta's gradient is dx rounded to bf16, as eager autograd
rounds it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from foldmill.moe.kernels.grid import cdiv, next_power_of_2

# Rows per backward program: each keeps a float32 partial of the weight gradient over its rows
# (at 8,192 rows 512 programs, whose partials are summed by torch).
_BACKWARD_ROWS = 16


@triton.jit
def _add_rms_norm_forward_kernel(x_ptr, delta_ptr, weight_ptr, h_ptr, y_ptr, rstd_ptr, cols, eps,
                                 BLOCK_C: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_C)
    mask = offs < cols
    base = row.to(tl.int64) * cols + offs
    x = tl.load(x_ptr + base, mask=mask, other=0.0).to(tl.float32)
    delta = tl.load(delta_ptr + base, mask=mask, other=0.0).to(tl.float32)
    h = (x + delta).to(h_ptr.dtype.element_ty)
    tl.store(h_ptr + base, h, mask=mask)
    h = h.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / cols + eps)
    weight = tl.load(weight_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + base, (h * rstd * weight).to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def _add_rms_norm_backward_kernel(dy_ptr, dh_ptr, h_ptr, weight_ptr, rstd_ptr, dx_ptr, dw_partial_ptr, rows,
                                  cols, HAS_DH: tl.constexpr, ROWS: tl.constexpr, BLOCK_C: tl.constexpr):
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK_C)
    mask = offs < cols
    weight = tl.load(weight_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK_C], dtype=tl.float32)
    for i in range(ROWS):
        row = pid * ROWS + i
        if row < rows:
            base = row.to(tl.int64) * cols + offs
            dy = tl.load(dy_ptr + base, mask=mask, other=0.0).to(tl.float32)
            h = tl.load(h_ptr + base, mask=mask, other=0.0).to(tl.float32)
            rstd = tl.load(rstd_ptr + row)
            dy_w = dy * weight
            # d/dh of h * rstd: rstd * g - h * rstd^3 * mean(g * h), for g = dy * weight
            mean = tl.sum(dy_w * h, axis=0) / cols
            dx = rstd * dy_w - (rstd * rstd * rstd * mean) * h
            if HAS_DH:
                dx += tl.load(dh_ptr + base, mask=mask, other=0.0).to(tl.float32)
            tl.store(dx_ptr + base, dx.to(dx_ptr.dtype.element_ty), mask=mask)
            dw += dy * h * rstd
    tl.store(dw_partial_ptr + pid.to(tl.int64) * cols + offs, dw, mask=mask)


def _warps(block_c: int) -> int:
    return min(max(block_c // 256, 1), 8)


class AddRMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, delta, weight, eps):
        cols = x.shape[-1]
        x2, delta2 = x.reshape(-1, cols).contiguous(), delta.reshape(-1, cols).contiguous()
        rows = x2.shape[0]
        h, y = torch.empty_like(x2), torch.empty_like(x2)
        rstd = torch.empty(rows, device=x.device, dtype=torch.float32)
        block_c = next_power_of_2(cols)
        _add_rms_norm_forward_kernel[(rows,)](x2, delta2, weight, h, y, rstd, cols, eps, BLOCK_C=block_c,
                                              num_warps=_warps(block_c))
        ctx.save_for_backward(h, weight, rstd)
        ctx.shape, ctx.delta_dtype = x.shape, delta.dtype
        ctx.set_materialize_grads(False)  # no zero-filled gradient for an unused h
        return h.view(x.shape), y.view(x.shape)

    @staticmethod
    def backward(ctx, grad_h, grad_y):
        h, weight, rstd = ctx.saved_tensors
        rows, cols = h.shape
        if grad_y is None:
            return grad_h, grad_h.to(ctx.delta_dtype), None, None
        grad_y = grad_y.reshape(rows, cols).contiguous()
        if grad_h is not None:
            grad_h = grad_h.reshape(rows, cols).contiguous()
        dx = torch.empty_like(h)
        programs = cdiv(rows, _BACKWARD_ROWS)
        block_c = next_power_of_2(cols)
        dw_partial = torch.empty(programs, cols, device=h.device, dtype=torch.float32)
        _add_rms_norm_backward_kernel[(programs,)](
            grad_y, grad_h if grad_h is not None else grad_y, h, weight, rstd, dx, dw_partial, rows, cols,
            HAS_DH=grad_h is not None, ROWS=_BACKWARD_ROWS, BLOCK_C=block_c, num_warps=_warps(block_c))
        dx = dx.view(ctx.shape)
        return dx, dx.to(ctx.delta_dtype), dw_partial.sum(dim=0).to(weight.dtype), None


def add_rms_norm_triton(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor,
                        eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, y): h = x + delta in x's dtype, y = rmsnorm(h) * weight; x, delta (..., cols) of one dtype,
    or x float32 and delta of a lower precision."""
    return AddRMSNorm.apply(x, delta, weight.to(x.dtype).contiguous(), eps)
