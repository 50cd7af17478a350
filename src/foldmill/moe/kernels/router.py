"""Triton top-k softmax routing: softmax, top-k, renormalized weights and the load-balancing sums in
one pass over the router's float32 logits, and the gradient in one more.

In torch the router's softmax, top-k, renormalization, one-hot assignments and the means of the
load-balancing loss were about twenty small kernels per MoE layer each way (2.0 ms per bio_8x1b
step at 2 x 4,096 tokens, mostly launch-bound reductions over (tokens, 8) tensors). Each program
here routes BLOCK_T tokens and writes its own partial sums of the probabilities and assignments per
expert, which torch adds in a fixed order, so every run gives the same bits. Experts are picked by
probability, the lower index first on ties.

weights_j = q_j / s, q_j the j-th largest probability, s their sum. Backward, with g the gradient of
the per-expert probability sums: dq_i = (dw_i - sum_j dw_j w_j) / s, dp = g + dq scattered to the
chosen experts, dlogits = p * (dp - sum_e dp_e p_e).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from foldmill.moe.kernels.grid import cdiv, next_power_of_2


@triton.jit
def _token_block(pid, tokens, num_experts, TOP_K: tl.constexpr, K_BLOCK: tl.constexpr, E_BLOCK: tl.constexpr,
                 BLOCK_T: tl.constexpr):
    """Indices and masks of program pid's BLOCK_T tokens: over the experts (offs, mask) and over
    the top-k slots (k_offs, k_mask)."""
    rows = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, E_BLOCK)
    k_cols = tl.arange(0, K_BLOCK)
    row_ok = rows < tokens
    col_ok = cols < num_experts
    offs = rows[:, None].to(tl.int64) * num_experts + cols[None, :]
    mask = row_ok[:, None] & col_ok[None, :]
    k_offs = rows[:, None].to(tl.int64) * TOP_K + k_cols[None, :]
    k_mask = row_ok[:, None] & (k_cols[None, :] < TOP_K)
    return cols, k_cols, row_ok, col_ok, offs, mask, k_offs, k_mask


@triton.jit
def _top_k_softmax_kernel(logits_ptr, probs_ptr, weights_ptr, experts_ptr, partials_ptr, tokens, num_experts,
                          TOP_K: tl.constexpr, K_BLOCK: tl.constexpr, E_BLOCK: tl.constexpr,
                          BLOCK_T: tl.constexpr):
    """partials[program, 0, e]: the program's sum of p[:, e]; partials[program, 1, e]: its tokens
    that chose e."""
    pid = tl.program_id(0)
    cols, k_cols, row_ok, col_ok, offs, mask, k_offs, k_mask = _token_block(
        pid, tokens, num_experts, TOP_K, K_BLOCK, E_BLOCK, BLOCK_T)
    logits = tl.load(logits_ptr + offs, mask=mask, other=0.0)
    logits = tl.where(col_ok[None, :], logits, float("-inf"))
    exps = tl.exp(logits - tl.max(logits, axis=1)[:, None])
    probs = exps / tl.sum(exps, axis=1)[:, None]
    tl.store(probs_ptr + offs, probs, mask=mask)

    taken = cols[None, :] >= num_experts  # padding columns are never chosen
    top = tl.zeros((BLOCK_T, K_BLOCK), dtype=tl.float32)
    chosen = tl.zeros((BLOCK_T, K_BLOCK), dtype=tl.int64)
    for slot in tl.static_range(TOP_K):
        candidates = tl.where(taken, -1.0, probs)  # probabilities are >= 0
        best = tl.max(candidates, axis=1)
        index = tl.min(tl.where((candidates == best[:, None]) & ~taken, cols[None, :], E_BLOCK), axis=1)
        index = tl.minimum(index, num_experts - 1)  # NaN logits match nothing; stay in bounds
        hit = cols[None, :] == index[:, None]
        taken = taken | hit
        top = tl.where(k_cols[None, :] == slot, tl.sum(tl.where(hit, probs, 0.0), axis=1)[:, None], top)
        chosen = tl.where(k_cols[None, :] == slot, index[:, None].to(tl.int64), chosen)
    weights = top / tl.sum(top, axis=1)[:, None]
    tl.store(weights_ptr + k_offs, weights, mask=k_mask)
    tl.store(experts_ptr + k_offs, chosen, mask=k_mask)

    assigned = (taken & col_ok[None, :] & row_ok[:, None]).to(tl.float32)
    prob_sums = tl.sum(tl.where(mask, probs, 0.0), axis=0)
    partials = partials_ptr + pid * 2 * E_BLOCK + cols
    tl.store(partials, prob_sums)
    tl.store(partials + E_BLOCK, tl.sum(assigned, axis=0))


@triton.jit
def _top_k_softmax_backward_kernel(probs_ptr, weights_ptr, experts_ptr, grad_weights_ptr, grad_sums_ptr,
                                   grad_logits_ptr, tokens, num_experts, TOP_K: tl.constexpr,
                                   K_BLOCK: tl.constexpr, E_BLOCK: tl.constexpr, BLOCK_T: tl.constexpr):
    cols, k_cols, _row_ok, col_ok, offs, mask, k_offs, k_mask = _token_block(
        tl.program_id(0), tokens, num_experts, TOP_K, K_BLOCK, E_BLOCK, BLOCK_T)
    probs = tl.load(probs_ptr + offs, mask=mask, other=0.0)
    weights = tl.load(weights_ptr + k_offs, mask=k_mask, other=0.0)
    chosen = tl.load(experts_ptr + k_offs, mask=k_mask, other=-1)
    grad_weights = tl.load(grad_weights_ptr + k_offs, mask=k_mask, other=0.0)

    top = tl.zeros((BLOCK_T, K_BLOCK), dtype=tl.float32)  # the chosen probabilities, as the forward pass
    for slot in tl.static_range(TOP_K):
        index = tl.sum(tl.where(k_cols[None, :] == slot, chosen, 0), axis=1)
        prob = tl.sum(tl.where(cols[None, :] == index[:, None], probs, 0.0), axis=1)
        top = tl.where(k_cols[None, :] == slot, prob[:, None], top)
    total = tl.sum(top, axis=1)
    grad_top = (grad_weights - tl.sum(grad_weights * weights, axis=1)[:, None]) / total[:, None]

    grad_probs = tl.load(grad_sums_ptr + cols, mask=col_ok, other=0.0)[None, :] + tl.zeros_like(probs)
    for slot in tl.static_range(TOP_K):
        index = tl.sum(tl.where(k_cols[None, :] == slot, chosen, 0), axis=1)
        grad = tl.sum(tl.where(k_cols[None, :] == slot, grad_top, 0.0), axis=1)
        grad_probs += tl.where(cols[None, :] == index[:, None], grad[:, None], 0.0)
    grad_logits = probs * (grad_probs - tl.sum(grad_probs * probs, axis=1)[:, None])
    tl.store(grad_logits_ptr + offs, grad_logits, mask=mask)


_BLOCK_T, _WARPS = 64, 4


def _constants(num_experts: int, top_k: int) -> dict:
    return {"TOP_K": top_k, "K_BLOCK": max(next_power_of_2(top_k), 2),
            "E_BLOCK": max(next_power_of_2(num_experts), 2), "BLOCK_T": _BLOCK_T}


class TopKSoftmax(torch.autograd.Function):
    """logits (tokens, experts) float32 -> weights (tokens, top_k) float32, experts (tokens, top_k)
    int64, sums (2, experts) float32: each expert's summed probability, and its assignments."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, top_k: int):
        logits = logits.contiguous()
        tokens, num_experts = logits.shape
        constants = _constants(num_experts, top_k)
        grid = (cdiv(tokens, _BLOCK_T),)
        probs = torch.empty_like(logits)
        weights = torch.empty(tokens, top_k, dtype=torch.float32, device=logits.device)
        experts = torch.empty(tokens, top_k, dtype=torch.int64, device=logits.device)
        partials = torch.empty(grid[0], 2, constants["E_BLOCK"], dtype=torch.float32, device=logits.device)
        _top_k_softmax_kernel[grid](logits, probs, weights, experts, partials, tokens, num_experts, **constants,
                                    num_warps=_WARPS)
        sums = partials.sum(dim=0)[:, :num_experts].contiguous()
        ctx.top_k = top_k
        ctx.mark_non_differentiable(experts)
        ctx.save_for_backward(probs, weights, experts)
        return weights, experts, sums

    @staticmethod
    def backward(ctx, grad_weights, _grad_experts, grad_sums):
        probs, weights, experts = ctx.saved_tensors
        tokens, num_experts = probs.shape
        if grad_weights is None:
            grad_weights = torch.zeros_like(weights)
        if grad_sums is None:
            grad_prob_sums = torch.zeros(num_experts, dtype=torch.float32, device=probs.device)
        else:
            grad_prob_sums = grad_sums[0].contiguous()
        grad_logits = torch.empty_like(probs)
        _top_k_softmax_backward_kernel[(cdiv(tokens, _BLOCK_T),)](
            probs, weights, experts, grad_weights.contiguous(), grad_prob_sums, grad_logits, tokens, num_experts,
            **_constants(num_experts, ctx.top_k), num_warps=_WARPS)
        return grad_logits, None


def top_k_softmax_triton(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return TopKSoftmax.apply(logits, top_k)
