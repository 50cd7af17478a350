"""Top-k softmax router with renormalized weights and the Switch load-balancing loss."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


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
        # Routing decisions are made in float32: bf16 logits flip near-ties between experts.
        logits = F.linear(x.float(), self.gate.weight.float())
        probs = logits.softmax(dim=-1)
        top_probs, top_experts = probs.topk(self.top_k, dim=-1)
        weights = top_probs / top_probs.sum(dim=-1, keepdim=True)
        assignments = torch.zeros_like(probs).scatter_(1, top_experts, 1.0)
        load = assignments.mean(dim=0) / self.top_k
        aux_loss = self.num_experts * (load * probs.mean(dim=0)).sum()
        return Routing(weights, top_experts, aux_loss, load.detach())
