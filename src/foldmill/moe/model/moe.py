"""The dropless MoE feed-forward block: route, permute by expert, grouped SwiGLU experts, unpermute."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from foldmill.moe.config import ModelConfig
from foldmill.moe.experts import get_backend
from foldmill.moe.experts.mlp import grouped_swiglu_experts
from foldmill.moe.experts.routing import permute_tokens, plan_routing, unpermute_tokens
from foldmill.moe.kernels import use_triton
from foldmill.moe.model.router import TopKRouter
from foldmill.moe.parallel.expert_parallel import expert_parallel_experts
from foldmill.moe.parallel.mesh import ExpertShard


@dataclass
class MoEOutput:
    hidden: torch.Tensor
    aux_loss: torch.Tensor
    load: torch.Tensor  # (num_experts,) fraction of assignments


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The autocast dtype when autocast is on for x's device, else x's own dtype."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


def to_compute_dtype(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t cast to `dtype`. On CUDA a float32 tensor's gradient comes back through a vectorized
    kernel (moe/kernels/cast.py): under bf16-mixed that is every expert weight's gradient."""
    if t.dtype == torch.float32 and dtype != t.dtype and use_triton(t) and not torch.compiler.is_compiling():
        from foldmill.moe.kernels.cast import cast_for_compute_triton

        return cast_for_compute_triton(t, dtype)
    return t.to(dtype)


class Experts(nn.Module):
    """All experts' weights as 3-D tensors (Hugging Face Mixtral's layout and names).

    With expert parallelism (moe.parallel.sharding.shard_experts) the tensors hold only this
    rank's experts and `shard` says where the others are; tokens then travel by all-to-all.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        experts, hidden, ffn = config.num_experts, config.hidden_size, config.ffn_size
        self.gate_up_proj = nn.Parameter(torch.empty(experts, 2 * ffn, hidden))  # [gate; up]
        self.down_proj = nn.Parameter(torch.empty(experts, hidden, ffn))
        self.backend = get_backend(config.expert_backend, config.fp8_fast_accumulation,
                                   config.mxfp8_store_swiglu_input, config.keep_weight_copies)
        self.recompute = config.recompute_experts
        self.shard: ExpertShard | None = None

    def forward(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """x (tokens, H); weights, experts (tokens, top_k) -> (tokens, H)."""
        dtype = compute_dtype(x)
        with torch.autocast(x.device.type, enabled=False):
            x, w13, w2 = (to_compute_dtype(t, dtype) for t in (x, self.gate_up_proj, self.down_proj))
            if self.shard is not None:
                return expert_parallel_experts(x, weights, experts, w13, w2, self.backend, self.shard,
                                               self.recompute)
            plan = plan_routing(experts, w13.shape[0], self.backend.pad_multiple, self.backend.nonempty_groups)
            rows, row_probs = permute_tokens(x, weights, plan)
            out_rows = grouped_swiglu_experts(rows, row_probs, w13, w2, plan.group_ends, self.backend,
                                              self.recompute)
            return unpermute_tokens(out_rows, plan)


class MoEBlock(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.router = TopKRouter(config.hidden_size, config.num_experts, config.top_k)
        self.experts = Experts(config)

    def forward(self, x: torch.Tensor) -> MoEOutput:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        routing = self.router(flat)
        out = self.experts(flat, routing.weights, routing.experts)
        return MoEOutput(out.view(shape), routing.aux_loss, routing.load)
