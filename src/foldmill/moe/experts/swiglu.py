"""SwiGLU scaled by each row's routing weight: a = silu(gate) * up * p, with h = [gate | up].

Applying the routing weight here (before the second GEMM, which is linear) instead of after it
lets the unpermute be a plain sum. On CUDA the fused Triton kernel does this in one pass and can
also emit the MXFP8 copy of `a` that the second GEMM consumes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from foldmill.moe.kernels import use_triton
from foldmill.moe.quant.mx import MXTensor, quantize_mx


def swiglu_forward(h: torch.Tensor, row_probs: torch.Tensor, quantize: bool) -> tuple[torch.Tensor, MXTensor | None]:
    """a (rows, F) in h's dtype, and its MXFP8 copy (blocks along F) when `quantize`."""
    if use_triton(h):
        from foldmill.moe.kernels.swiglu import swiglu_forward_triton

        return swiglu_forward_triton(h, row_probs, quantize)
    gate, up = h.float().chunk(2, dim=-1)
    a = F.silu(gate) * up * row_probs.float().unsqueeze(-1)
    return a.to(h.dtype), (quantize_mx(a.to(h.dtype)) if quantize else None)


def swiglu_backward(h: torch.Tensor, row_probs: torch.Tensor, grad_a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_h (rows, 2F) in h's dtype, grad_row_probs (rows,) float32)."""
    if use_triton(h):
        from foldmill.moe.kernels.swiglu import swiglu_backward_triton

        return swiglu_backward_triton(h, row_probs, grad_a)
    gate, up = h.float().chunk(2, dim=-1)
    grad_a = grad_a.float()
    p = row_probs.float().unsqueeze(-1)
    sigmoid = torch.sigmoid(gate)
    silu = gate * sigmoid
    grad_up = grad_a * p * silu
    grad_gate = grad_a * p * up * sigmoid * (1 + gate * (1 - sigmoid))
    grad_probs = (grad_a * silu * up).sum(dim=-1)
    return torch.cat([grad_gate, grad_up], dim=-1).to(h.dtype), grad_probs
