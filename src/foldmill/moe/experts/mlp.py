"""The expert MLP over expert-sorted rows, as one autograd function with an explicit backward.

forward:  h = GEMM(x, w13);  a = silu(h_gate) * h_up * p;  y = GEMM(a, w2)
backward: da = dgrad(dy, w2);  dw2 = wgrad(dy, a);  (dh, dp) = SwiGLU'(h, p, da);
          dx = dgrad(dh, w13); dw13 = wgrad(dh, x)
Which GEMMs run (bf16 loop or grouped, FP8, MXFP8) is the backend's business.
"""

from __future__ import annotations

import torch

from foldmill.moe.experts.gemm import ExpertGemm
from foldmill.moe.experts.swiglu import swiglu_backward, swiglu_forward


class GroupedSwiGLUExperts(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, row_probs, w13, w2, ends, gemm: ExpertGemm):
        h = gemm.forward(x, w13, ends)
        a, a_quantized = swiglu_forward(h, row_probs, quantize=gemm.quantized_input)
        y = gemm.forward(a, w2, ends, x_quantized=a_quantized)
        ctx.gemm = gemm
        ctx.save_for_backward(x, row_probs, w13, w2, ends, h, a)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x, row_probs, w13, w2, ends, h, a = ctx.saved_tensors
        gemm = ctx.gemm
        grad_y = grad_y.contiguous()
        grad_a = gemm.dgrad(grad_y, w2, ends)
        grad_w2 = gemm.wgrad(grad_y, a, ends)
        grad_h, grad_probs = swiglu_backward(h, row_probs, grad_a)
        grad_x = gemm.dgrad(grad_h, w13, ends)
        grad_w13 = gemm.wgrad(grad_h, x, ends)
        return grad_x, grad_probs.to(row_probs.dtype), grad_w13, grad_w2, None, None


def grouped_swiglu_experts(
    x: torch.Tensor, row_probs: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, ends: torch.Tensor, gemm: ExpertGemm
) -> torch.Tensor:
    """Expert outputs (rows, H), already scaled by each row's routing weight.

    x (rows, H) sorted by expert; w13 (experts, 2F, H) = [gate; up]; w2 (experts, H, F).
    """
    return GroupedSwiGLUExperts.apply(x, row_probs, w13, w2, ends, gemm)
