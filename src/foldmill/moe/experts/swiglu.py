"""SwiGLU scaled by each row's routing weight: a = silu(gate) * up * p, with h = [gate | up].

Applying the routing weight here (before the second GEMM, which is linear) instead of after it
lets the unpermute be a plain sum. On CUDA one Triton kernel does each direction in one pass (the
MXFP8 backend runs them writing its operands' copies instead: experts.mxfp8).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from foldmill.moe.kernels import use_triton


def swiglu_forward(h: torch.Tensor, row_probs: torch.Tensor) -> torch.Tensor:
    """a (rows, F) in h's dtype."""
    if use_triton(h):
        from foldmill.moe.kernels.swiglu import swiglu_forward_triton

        return swiglu_forward_triton(h, row_probs)
    gate, up = h.float().chunk(2, dim=-1)
    return (F.silu(gate) * up * row_probs.float().unsqueeze(-1)).to(h.dtype)


def swiglu_backward(
    h: torch.Tensor, row_probs: torch.Tensor, grad_a: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
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


class UnfusedSwiGLU:
    """SwiGLU for backends whose GEMMs take plain tensors: the output and gradient as they are."""

    @staticmethod
    def swiglu_forward(h: torch.Tensor, row_probs: torch.Tensor) -> torch.Tensor:
        return swiglu_forward(h, row_probs)

    @staticmethod
    def saved_swiglu_input(h: torch.Tensor, a_saved: object) -> torch.Tensor:
        return h

    @staticmethod
    def swiglu_backward(h: torch.Tensor, row_probs: torch.Tensor, grad_a: torch.Tensor):
        return swiglu_backward(h, row_probs, grad_a)
