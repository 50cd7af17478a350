"""Dropless routing plan and the token permute / unpermute autograd functions.

Every (token, slot) pair chosen by the router gets one row in an expert-sorted buffer; each
expert's group is padded with zero rows to a multiple of the backend's `pad_multiple`. The buffer
has a static size (tokens * top_k + experts * (pad_multiple - 1), rounded up), so planning needs
no host synchronization.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from foldmill.moe.kernels import use_triton


@dataclass
class RoutingPlan:
    slot_rows: torch.Tensor  # (tokens, top_k) int64: buffer row of each (token, slot)
    source_slots: torch.Tensor  # (rows,) int64: flat (token * top_k + slot) feeding each row, -1 = padding
    group_ends: torch.Tensor  # (experts,) int32 cumulative ends of the padded groups
    tokens_per_expert: torch.Tensor  # (experts,) int64 real assignments per expert
    top_k: int

    @property
    def rows(self) -> int:
        return self.source_slots.shape[0]


def plan_routing(
    expert_index: torch.Tensor, num_experts: int, pad_multiple: int, nonempty_groups: bool = False
) -> RoutingPlan:
    """Plan for `expert_index` (tokens, top_k), the experts chosen for each token.

    nonempty_groups: an expert no token chose still gets one block of `pad_multiple` zero rows
    (for GEMMs whose zero-row groups are not guaranteed to write zeros).
    """
    tokens, top_k = expert_index.shape
    flat = expert_index.reshape(-1)
    capacity = flat.numel() + num_experts * (pad_multiple if nonempty_groups else pad_multiple - 1)
    capacity = (capacity + pad_multiple - 1) // pad_multiple * pad_multiple
    planned = None
    if use_triton(flat):
        from foldmill.moe.kernels.routing import plan_routing_triton

        planned = plan_routing_triton(flat, num_experts, pad_multiple, nonempty_groups, capacity)
    if planned is None:
        planned = _plan_in_torch(flat, num_experts, pad_multiple, nonempty_groups, capacity)
    slot_rows, source_slots, padded_ends, counts = planned
    return RoutingPlan(slot_rows.view(tokens, top_k), source_slots, padded_ends, counts, top_k)


def _plan_in_torch(flat: torch.Tensor, num_experts: int, pad_multiple: int, nonempty_groups: bool,
                   capacity: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(slot_rows, source_slots, padded group ends int32, tokens per expert int64) of the flat
    expert index: the slots sorted by expert, stably, each group padded."""
    # scatter_add, not bincount: bincount sizes its output from the data and so waits for the GPU.
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + pad_multiple - 1) // pad_multiple * pad_multiple
    if nonempty_groups:
        padded = padded.clamp_min(pad_multiple)
    padded_ends = torch.cumsum(padded, 0)
    order = torch.argsort(flat, stable=True)
    sorted_experts = flat[order]
    starts = torch.cumsum(counts, 0) - counts
    rank_in_group = torch.arange(flat.numel(), device=flat.device) - starts[sorted_experts]
    rows_sorted = padded_ends[sorted_experts] - padded[sorted_experts] + rank_in_group
    slot_rows = torch.empty_like(flat)
    slot_rows[order] = rows_sorted
    source_slots = torch.full((capacity,), -1, dtype=torch.int64, device=flat.device)
    source_slots[slot_rows] = torch.arange(flat.numel(), device=flat.device)
    return slot_rows, source_slots, padded_ends.to(torch.int32), counts


def permute_rows(
    source: torch.Tensor, source_slots: torch.Tensor, top_k: int, probs: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Row r = source[source_slots[r] // top_k] (zero where -1), and with `probs` (tokens, top_k)
    also each row's routing weight probs.flat[source_slots[r]] (zero for padding)."""
    if use_triton(source):
        from foldmill.moe.kernels.permute import permute_rows_triton

        return permute_rows_triton(source, source_slots, top_k, probs)
    valid = source_slots >= 0
    slots = source_slots.clamp_min(0)
    rows = source.index_select(0, slots // top_k) * valid.unsqueeze(-1).to(source.dtype)
    row_probs = None if probs is None else probs.reshape(-1)[slots] * valid.to(probs.dtype)
    return rows, row_probs


def sum_rows(source: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """(tokens, H): sum over k of source[index[:, k]], accumulated in float32."""
    if use_triton(source):
        from foldmill.moe.kernels.permute import sum_rows_triton

        return sum_rows_triton(source, index)
    tokens, top_k = index.shape
    rows = source.index_select(0, index.reshape(-1)).float()
    return rows.view(tokens, top_k, -1).sum(dim=1).to(source.dtype)


class PermuteTokens(torch.autograd.Function):
    """x (tokens, H), probs (tokens, top_k) -> expert-sorted rows (rows, H) and their weights (rows,)."""

    @staticmethod
    def forward(ctx, x, probs, plan: RoutingPlan):
        ctx.plan = plan
        return permute_rows(x, plan.source_slots, plan.top_k, probs)

    @staticmethod
    def backward(ctx, grad_rows, grad_row_probs):
        plan = ctx.plan
        grad_x = sum_rows(grad_rows, plan.slot_rows) if ctx.needs_input_grad[0] else None
        grad_probs = grad_row_probs[plan.slot_rows] if ctx.needs_input_grad[1] else None
        return grad_x, grad_probs, None


class UnpermuteTokens(torch.autograd.Function):
    """Expert outputs (rows, H) -> per-token sums over the token's top_k rows (tokens, H)."""

    @staticmethod
    def forward(ctx, rows, plan: RoutingPlan):
        ctx.plan = plan
        return sum_rows(rows, plan.slot_rows)

    @staticmethod
    def backward(ctx, grad_out):
        plan = ctx.plan
        grad_rows, _ = permute_rows(grad_out.contiguous(), plan.source_slots, plan.top_k)
        return grad_rows, None


def permute_tokens(x: torch.Tensor, probs: torch.Tensor, plan: RoutingPlan) -> tuple[torch.Tensor, torch.Tensor]:
    return PermuteTokens.apply(x, probs, plan)


def unpermute_tokens(rows: torch.Tensor, plan: RoutingPlan) -> torch.Tensor:
    return UnpermuteTokens.apply(rows, plan)
