"""Pair-weighted averaging: MSA (B, S, N, c_m), pair (B, N, N, c_z), token-pair mask (B, N, N)
-> MSA update (B, S, N, c_m). AF3 Algorithm 10.

Each head turns the pair representation into attention weights over tokens j (softmax
over j, shared by all MSA rows) and averages the projected MSA values of row s with them,
gated by the MSA itself. Parameter names (norm_m, norm_z, proj_m, proj_g, proj_z, proj_o)
match the Boltz-2 checkpoint.

`pair_weighted_average` (the average and its gate, after the projections and the softmax) is the
reference of the "pair_weighted_average" op of foldmill.kernels, which a fused kernel replaces on
the GPU.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from foldmill import kernels
from foldmill.model.layers.layer_norm import LayerNorm


def pair_weighted_average(weights: Tensor, values: Tensor, gate: Tensor) -> Tensor:
    """weights: (B, H, N, N) softmax over j; values, gate: (B, S, N, H * D) -> (B, S, N, H * D):
    sigmoid(gate) * the average of each head's values over tokens j."""
    batch, msa_rows, tokens, width = values.shape
    heads = weights.shape[1]
    per_head = values.reshape(batch, msa_rows, tokens, heads, width // heads).permute(0, 3, 1, 2, 4)  # (B, h, S, N, D)
    out = torch.einsum("bhij,bhsjd->bhsid", weights, per_head).permute(0, 2, 3, 1, 4)
    return gate.sigmoid() * out.reshape(batch, msa_rows, tokens, width)


class PairWeightedAveraging(nn.Module):
    """Row-wise MSA update with attention weights taken from the pair track only."""

    def __init__(self, c_m: int, c_z: int, c_h: int, num_heads: int, inf: float = 1e6) -> None:
        super().__init__()
        self.c_h = c_h
        self.num_heads = num_heads
        self.inf = inf
        self.norm_m = LayerNorm(c_m)
        self.norm_z = LayerNorm(c_z)
        self.proj_m = nn.Linear(c_m, c_h * num_heads, bias=False)
        self.proj_g = nn.Linear(c_m, c_h * num_heads, bias=False)
        self.proj_z = nn.Linear(c_z, num_heads, bias=False)
        self.proj_o = nn.Linear(c_h * num_heads, c_m, bias=False)

    def _head_update(self, m: Tensor, z: Tensor, mask: Tensor, heads: slice) -> Tensor:
        """Gated, averaged values of the given heads, flattened: (B, S, N, n_heads * c_h)."""
        channels = slice(heads.start * self.c_h, heads.stop * self.c_h)
        # values and gate from one product: one pass over the MSA
        values, gate = F.linear(m, torch.cat([self.proj_m.weight[channels], self.proj_g.weight[channels]])).chunk(2, -1)
        logits = F.linear(z, self.proj_z.weight[heads]).permute(0, 3, 1, 2)  # (B, h, N, N)
        weights = torch.softmax(logits + (1 - mask[:, None]) * -self.inf, dim=-1)
        return kernels.dispatch("pair_weighted_average", weights, values, gate)

    def forward(self, m: Tensor, z: Tensor, mask: Tensor, chunk_heads: bool = False) -> Tensor:
        """chunk_heads computes one head at a time to bound memory on deep MSAs."""
        m = self.norm_m(m)
        z = self.norm_z(z)
        if not chunk_heads:
            return self.proj_o(self._head_update(m, z, mask, slice(0, self.num_heads)))
        out = None
        for head in range(self.num_heads):
            update = self._head_update(m, z, mask, slice(head, head + 1))
            part = update @ self.proj_o.weight[:, head * self.c_h : (head + 1) * self.c_h].T
            out = part if out is None else out + part
        return out


# The plain PyTorch implementations the kernel registry runs where no backend applies.
kernels.register_reference("pair_weighted_average", pair_weighted_average)
