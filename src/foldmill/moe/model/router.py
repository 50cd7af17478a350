"""Top-k softmax router with renormalized weights and the Switch load-balancing loss."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from foldmill.moe.kernels import use_triton


@dataclass
class Routing:
    weights: torch.Tensor  # (tokens, top_k) float32, summing to 1 per token
    experts: torch.Tensor  # (tokens, top_k) int64
    aux_loss: torch.Tensor  # scalar: num_experts * sum_e (fraction routed to e) * (mean probability of e)
    load: torch.Tensor  # (num_experts,) fraction of assignments per expert (detached)


class TopKRouter(nn.Module):
    def __init__(self, hidden_size: int, num_experts: int, top_k: int) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.top_k = top_k
        self.gate = nn.Linear(hidden_size, num_experts, bias=False)

    def forward(self, x: torch.Tensor) -> Routing:
        logits = router_logits(x, self.gate.weight)
        weights, experts, sums = top_k_softmax(logits, self.top_k)
        tokens = logits.shape[0]
        load = sums[1].detach() / (tokens * self.top_k)
        aux_loss = self.num_experts * (load * (sums[0] / tokens)).sum()
        return Routing(weights, experts, aux_loss, load)


def top_k_softmax(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits (tokens, experts) -> the top_k experts of each token by softmax probability, their
    probabilities renormalized to sum to 1, and sums (2, experts): each expert's summed probability
    over the tokens and its count of assignments. For float32 logits on CUDA, one Triton kernel each
    way (moe/kernels/router.py)."""
    if _float32_kernels_apply(logits):
        from foldmill.moe.kernels.router import top_k_softmax_triton

        return top_k_softmax_triton(logits, top_k)
    probs = logits.softmax(dim=-1)
    top_probs, experts = probs.topk(top_k, dim=-1)
    weights = top_probs / top_probs.sum(dim=-1, keepdim=True)
    counts = torch.zeros_like(probs).scatter_(1, experts, 1.0).sum(dim=0)
    return weights, experts, torch.stack([probs.sum(dim=0), counts])


def _float32_kernels_apply(tokens: torch.Tensor) -> bool:
    """The router's Triton kernels take float32 (tokens, ...) tensors on CUDA, outside torch.compile
    (which fuses torch's formulas its own way)."""
    return (use_triton(tokens) and tokens.dtype == torch.float32 and tokens.shape[0] > 0
            and not torch.compiler.is_compiling())


# The most experts whose float32 logits take the Triton kernels: at 32, cuBLAS was faster on an H200.
TRITON_LOGITS_MAX_EXPERTS = 16


def router_logits(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """float32 logits x @ weight.T. Routing decisions are made in float32: bf16 logits flip near-ties
    between experts. With bf16 x and weight on CUDA the product runs on tensor cores (each bf16 product
    is exact, the sums are float32) instead of a float32 GEMM on a float32 copy of x, which the
    backward pass would also keep. Autocast (the bf16-mixed recipe) would run the float32 GEMM in
    bf16, so it is off here. With float32 x and weight on CUDA (bf16-mixed) and few experts, Triton
    kernels read x once each way (moe/kernels/router_logits.py): cuBLAS ran these float32 GEMMs with 8
    output columns on CUDA cores, reading x at 0.8 to 1.3 TB/s on an H200 that copies at 3.7. With
    more experts the FMAs bound the work, and cuBLAS is as fast or faster."""
    if x.is_cuda and x.dtype == weight.dtype == torch.bfloat16:
        return _TensorCoreLogits.apply(x, weight)
    with torch.autocast(x.device.type, enabled=False):
        if (_float32_kernels_apply(x) and weight.dtype == torch.float32
                and weight.shape[0] <= TRITON_LOGITS_MAX_EXPERTS):
            from foldmill.moe.kernels.router_logits import router_logits_triton

            return router_logits_triton(x, weight)
        return F.linear(x.float(), weight.float())


class _TensorCoreLogits(torch.autograd.Function):
    """float32 logits from bf16 operands, and their gradients at float32 accuracy.

    The float32 gradient g of the logits is exactly the sum of three bf16 terms (8 significant bits
    each, a float32's 24 together, wherever |g| > 2^-102 keeps the last term out of bf16's
    subnormals), so the backward GEMMs also run on tensor cores with float32 sums:
    dx = [g1, g2, g3] @ [w; w; w] and dw = g1^T x + g2^T x + g3^T x.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        return torch.mm(x, weight.t(), out_dtype=torch.float32)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, weight = ctx.saved_tensors
        split = torch.cat(bf16_terms(grad), dim=1)
        grad_x = torch.mm(split, weight.repeat(3, 1))
        partial = torch.mm(split.t(), x, out_dtype=torch.float32).view(3, *weight.shape)
        return grad_x, partial.sum(dim=0).to(weight.dtype)


def bf16_terms(values: torch.Tensor) -> list[torch.Tensor]:
    """Three bf16 tensors whose sum is exactly `values` (float32 of magnitude above 2^-102): each
    term is the bf16 rounding of what the previous ones leave."""
    terms = []
    for _ in range(3):
        terms.append(values.to(torch.bfloat16))
        values = values - terms[-1].float()
    return terms
