"""Token dispatch and combine for expert parallelism: a differentiable all-to-all around the experts.

Each rank of an expert-parallel group of size P holds experts [rank * E/P, (rank + 1) * E/P).
 1. Route over all E experts and sort the (token, slot) rows by expert: consecutive experts live
    on the same rank, so the rows bound for each rank are contiguous.
 2. Exchange the per-expert row counts (an all-to-all of P x E/P integers): every rank learns the
    split sizes of the uneven all-to-alls that follow (one host synchronization per layer).
 3. All-to-all the rows and their routing weights. Received rows come by source rank, then by
    local expert; they are regrouped by local expert (padded as the backend wants) and run
    through the backend's grouped SwiGLU experts, exactly as in a single process. (A rank that
    receives nothing still takes part in every exchange, forward and backward.)
 4. All-to-all the outputs back (the splits swapped) and sum each token's top_k rows.
Inside an expert's group the rows keep the order they would have in one process fed the group's
batches one after another, so block-quantized backends (MXFP8's 32-row wgrad blocks) see the
same blocks. The backward of an all-to-all is the all-to-all with the splits swapped.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from foldmill.moe.experts.gemm import ExpertGemm
from foldmill.moe.experts.mlp import grouped_swiglu_experts
from foldmill.moe.experts.routing import permute_tokens, plan_routing, unpermute_tokens
from foldmill.moe.parallel.mesh import ExpertShard


def all_to_all(
    x: torch.Tensor, send_splits: list[int], receive_splits: list[int], group: dist.ProcessGroup
) -> torch.Tensor:
    """Rows x[sum(send_splits[:r]) : ...] go to rank r; the result stacks what each rank sent here."""
    out = x.new_empty((sum(receive_splits), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), receive_splits, send_splits, group=group)
    return out


class AllToAll(torch.autograd.Function):
    """Differentiable `all_to_all`: the gradient travels back along the same splits, reversed."""

    @staticmethod
    def forward(ctx, x, send_splits: list[int], receive_splits: list[int], group: dist.ProcessGroup):
        ctx.splits, ctx.group = (send_splits, receive_splits), group
        return all_to_all(x, send_splits, receive_splits, group)

    @staticmethod
    def backward(ctx, grad_out):
        send_splits, receive_splits = ctx.splits
        return all_to_all(grad_out, receive_splits, send_splits, ctx.group), None, None, None


def local_part(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (differentiably), or the tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def exchange_counts(tokens_per_expert: torch.Tensor, shard: ExpertShard) -> torch.Tensor:
    """(P, E/P): [s, j] = rows rank s sends to this rank's local expert j, from every rank's (E,) counts."""
    received = torch.empty_like(tokens_per_expert)
    dist.all_to_all_single(received, tokens_per_expert.contiguous(), group=shard.group)
    return received.view(shard.size, -1)


def expert_parallel_experts(
    x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
    backend: ExpertGemm, shard: ExpertShard, recompute: bool = False,
) -> torch.Tensor:
    """(tokens, H): the weighted sum of each token's top_k expert outputs, wherever the experts live.

    x (tokens, H); weights, experts (tokens, top_k) over all E experts; w13 (E/P, 2F, H) and
    w2 (E/P, H, F) this rank's experts (or global-shape DTensors holding them); `recompute` as in
    experts.mlp.
    """
    w13, w2 = local_part(w13), local_part(w2)
    local_experts = w13.shape[0]
    # No padding: exactly tokens * top_k rows, sorted by expert and so by destination rank.
    plan = plan_routing(experts, local_experts * shard.size, pad_multiple=1)
    rows, row_probs = permute_tokens(x, weights, plan)
    received_counts = exchange_counts(plan.tokens_per_expert, shard)
    splits = torch.stack([plan.tokens_per_expert.view(shard.size, -1).sum(1), received_counts.sum(1)])
    send_splits, receive_splits = splits.tolist()  # the host synchronization
    received_rows = AllToAll.apply(rows, send_splits, receive_splits, shard.group)
    received_probs = AllToAll.apply(row_probs, send_splits, receive_splits, shard.group)

    if received_rows.shape[0]:
        out = run_local_experts(received_rows, received_probs, received_counts, w13, w2, backend, recompute)
    else:
        out = nothing_received(received_rows, received_probs, w13, w2)
    returned = AllToAll.apply(out, receive_splits, send_splits, shard.group)
    return unpermute_tokens(returned, plan)


def run_local_experts(
    rows: torch.Tensor, probs: torch.Tensor, counts: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
    backend: ExpertGemm, recompute: bool = False,
) -> torch.Tensor:
    """Outputs (rows, H) for received rows ordered by (source rank, local expert), `counts` (P, E/P)."""
    local_experts = w13.shape[0]
    local_expert = torch.arange(local_experts, device=rows.device).repeat(counts.shape[0])
    local_expert = local_expert.repeat_interleave(counts.reshape(-1), output_size=rows.shape[0])
    plan = plan_routing(local_expert.unsqueeze(1), local_experts, backend.pad_multiple, backend.nonempty_groups)
    expert_rows, expert_probs = permute_tokens(rows, probs.unsqueeze(1), plan)
    out = grouped_swiglu_experts(expert_rows, expert_probs, w13, w2, plan.group_ends, backend, recompute)
    return unpermute_tokens(out, plan)


def nothing_received(rows: torch.Tensor, probs: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """The empty output of a rank whose experts no token chose, still depending on the received
    (empty) rows and weights and on the experts: the backward all-to-alls are collectives this rank
    must join, and its expert gradients (zeros) must exist for the gradient reduction."""
    anchor = (probs.sum() + w13.sum() + w2.sum()) * 0
    return rows + anchor.to(rows.dtype)
