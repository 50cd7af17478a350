"""The expert MLP over expert-sorted rows, as one autograd function with an explicit backward.

forward:  h = GEMM(x, w13);  a = silu(h_gate) * h_up * p;  y = GEMM(a, w2)
backward: (da, dw2) = GEMM'(dy, w2, a);  (dh, dp) = SwiGLU'(h, p, da);  (dx, dw13) = GEMM'(dh, w13, x)
Which GEMMs run (bf16 loop or grouped, FP8, MXFP8) is the backend's business; so is the form in
which x and a are kept for the weight gradients (8-bit backends keep them quantized), and the form
in which the SwiGLU hands a and grad_h to the GEMMs (the MXFP8 backend's SwiGLU writes their MXFP8
copies directly).

With `recompute`, the forward keeps x instead of h (rows x 2F, the largest activation of the step)
and x's 8-bit copy, and the backward runs the first GEMM again: the same operands through the same
deterministic kernels give the same h, for one more GEMM per layer. Otherwise the backend says what
the backward reads for h (`saved_swiglu_input`): h itself, or a compact copy of it that the second
GEMM's saved operand carries (the MXFP8 backend's `store_swiglu_input`).
"""

from __future__ import annotations

import torch

from foldmill.moe.experts.gemm import ExpertGemm


class GroupedSwiGLUExperts(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, row_probs, w13, w2, ends, gemm: ExpertGemm, recompute: bool):
        h, x_saved = gemm.forward(x, w13, ends)
        a = gemm.swiglu_forward(h, row_probs)
        y, a_saved = gemm.forward(a, w2, ends)
        ctx.gemm, ctx.recompute = gemm, recompute
        # Backend-specific forms of x, h and a may be tuples or MXFP8 tensors: kept on ctx.
        ctx.x_saved, ctx.a_saved = (None if recompute else x_saved), a_saved
        kept = x if recompute else gemm.saved_swiglu_input(h, a_saved)
        # A tensor goes through save_for_backward (saved-tensor hooks see it); a backend's compact
        # copy of h stays on ctx with x's and a's.
        ctx.h_saved = None if isinstance(kept, torch.Tensor) else kept
        ctx.save_for_backward(row_probs, w13, w2, ends, kept if ctx.h_saved is None else None)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        row_probs, w13, w2, ends, kept = ctx.saved_tensors
        kept = kept if ctx.h_saved is None else ctx.h_saved
        gemm = ctx.gemm
        h, x_saved = gemm.forward(kept, w13, ends) if ctx.recompute else (kept, ctx.x_saved)
        grad_a, grad_w2 = gemm.backward(grad_y.contiguous(), w2, ctx.a_saved, ends)
        grad_h, grad_probs = gemm.swiglu_backward(h, row_probs, grad_a)
        grad_x, grad_w13 = gemm.backward(grad_h, w13, x_saved, ends)
        ctx.x_saved = ctx.a_saved = ctx.h_saved = None
        return grad_x, grad_probs.to(row_probs.dtype), grad_w13, grad_w2, None, None, None


def grouped_swiglu_experts(
    x: torch.Tensor, row_probs: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, ends: torch.Tensor, gemm: ExpertGemm,
    recompute: bool = False,
) -> torch.Tensor:
    """Expert outputs (rows, H), already scaled by each row's routing weight.

    x (rows, H) sorted by expert; w13 (experts, 2F, H) = [gate; up]; w2 (experts, H, F).
    `recompute`: keep x rather than the first GEMM's output for the backward (see the module doc).
    A backend with `swiglu_experts` runs the whole MLP itself (its GEMMs compute the SwiGLU).
    """
    fused = getattr(gemm, "swiglu_experts", None)
    if fused is not None:
        return fused(x, row_probs, w13, w2, ends, recompute)
    return GroupedSwiGLUExperts.apply(x, row_probs, w13, w2, ends, gemm, recompute)
