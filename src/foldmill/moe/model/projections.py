"""Several linear projections of one input (attention's q, k and v), whose input gradient is summed
inside the backward GEMMs.

As separate nn.Linear calls, each projection's backward writes its own input gradient and autograd
adds them: two extra passes over a (tokens, hidden) tensor per layer. Under bf16 autocast (the
bf16-mixed recipe) it is worse: autocast casts the float32 input to bf16 once per projection, each
bf16 input gradient is converted to float32, and the adds run in float32. Here the input is cast
once, the first dgrad GEMM writes the input gradient and the others add into it in their epilogue
(addmm), in float32 where the input is float32 (bf16 operands, float32 sums, as the router's
logits), and the weight gradients come out of their GEMMs in the weights' dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from foldmill.moe.model.moe import compute_dtype


def project(x: torch.Tensor, weights: list[torch.Tensor]) -> list[torch.Tensor]:
    """[x @ w.T for w in weights] in x's compute dtype (autocast's, when on); x (..., in_features)."""
    if torch.compiler.is_compiling():  # the compiler fuses the plain formula its own way
        return [F.linear(x, weight) for weight in weights]
    flat = x.reshape(-1, x.shape[-1])
    outputs = SharedInputProjections.apply(flat, compute_dtype(x), *weights)
    return [out.view(*x.shape[:-1], out.shape[-1]) for out in outputs]


def _matmul(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype,
            accumulate: torch.Tensor | None = None) -> torch.Tensor:
    """a @ b (+ accumulate) with float32 sums, returned in out_dtype."""
    if out_dtype == a.dtype:
        return torch.mm(a, b) if accumulate is None else accumulate.addmm_(a, b)
    if a.is_cuda:  # cuBLAS writes the wider dtype from the float32 accumulator
        if accumulate is None:
            return torch.mm(a, b, out_dtype=out_dtype)
        # In place: out-of-place, torch first copies `accumulate` into a new tensor.
        return torch.addmm(accumulate, a, b, out_dtype=out_dtype, out=accumulate)
    product = torch.mm(a, b).to(out_dtype)  # the CPU has no mixed-dtype GEMM
    return product if accumulate is None else accumulate.add_(product)


class SharedInputProjections(torch.autograd.Function):
    """x (tokens, in) and weights (out_i, in) -> [x @ w_i.T] in `dtype`; gradients in the dtypes of x
    and of each weight."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, dtype: torch.dtype, *weights: torch.Tensor):
        x_compute = x.to(dtype)
        weights_compute = [weight.to(dtype) for weight in weights]
        ctx.x_dtype = x.dtype
        ctx.weight_dtypes = [weight.dtype for weight in weights]
        ctx.save_for_backward(x_compute, *weights_compute)
        return tuple(torch.mm(x_compute, weight.t()) for weight in weights_compute)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor | None):
        x_compute, *weights_compute = ctx.saved_tensors
        grad_x = None
        if ctx.needs_input_grad[0]:
            for grad, weight in zip(grads, weights_compute, strict=True):
                if grad is not None:
                    grad_x = _matmul(grad, weight, ctx.x_dtype, grad_x)
            if grad_x is None:
                grad_x = torch.zeros_like(x_compute, dtype=ctx.x_dtype)
        grad_weights = []
        for index, (grad, dtype) in enumerate(zip(grads, ctx.weight_dtypes, strict=True)):
            needed = ctx.needs_input_grad[2 + index] and grad is not None
            grad_weights.append(_matmul(grad.t(), x_compute, dtype) if needed else None)
        return grad_x, None, *grad_weights
