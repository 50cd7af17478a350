"""The expert MLP over expert-sorted rows, as one autograd function with an explicit backward.

forward:  h = GEMM(x, w13);  a = silu(h_gate) * h_up * p;  y = GEMM(a, w2)
backward: (da, dw2) = GEMM'(dy, w2, a);  (dh, dp) = SwiGLU'(h, p, da);  (dx, dw13) = GEMM'(dh, w13, x)
Which GEMMs run (bf16 loop or grouped, FP8, MXFP8) is the backend's business; so is the form in
which x and a are kept for the weight gradients (8-bit backends keep them quantized).
"""

from __future__ import annotations

import torch

from foldmill.moe.experts.gemm import ExpertGemm
from foldmill.moe.experts.swiglu import swiglu_backward, swiglu_forward


class GroupedSwiGLUExperts(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, row_probs, w13, w2, ends, gemm: ExpertGemm):
        h, x_saved = gemm.forward(x, w13, ends)
        a, _ = swiglu_forward(h, row_probs, quantize=False)
        y, a_saved = gemm.forward(a, w2, ends)
        ctx.gemm = gemm
        # Backend-specific forms of x and a may be tuples or MXFP8 tensors: kept on ctx.
        ctx.x_saved, ctx.a_saved = x_saved, a_saved
        ctx.save_for_backward(row_probs, w13, w2, ends, h)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        row_probs, w13, w2, ends, h = ctx.saved_tensors
        gemm = ctx.gemm
        grad_a, grad_w2 = gemm.backward(grad_y.contiguous(), w2, ctx.a_saved, ends)
        grad_h, grad_probs = swiglu_backward(h, row_probs, grad_a)
        grad_x, grad_w13 = gemm.backward(grad_h, w13, ctx.x_saved, ends)
        ctx.x_saved = ctx.a_saved = None
        return grad_x, grad_probs.to(row_probs.dtype), grad_w13, grad_w2, None, None


def grouped_swiglu_experts(
    x: torch.Tensor, row_probs: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, ends: torch.Tensor, gemm: ExpertGemm
) -> torch.Tensor:
    """Expert outputs (rows, H), already scaled by each row's routing weight.

    x (rows, H) sorted by expert; w13 (experts, 2F, H) = [gate; up]; w2 (experts, H, F).
    """
    return GroupedSwiGLUExperts.apply(x, row_probs, w13, w2, ends, gemm)
