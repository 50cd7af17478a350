"""Triangle self-attention around the starting / ending node, AF3 Algorithms 14/15.

Input z (B, N, N, C) and pair mask (B, N, N) -> update (B, N, N, C) (the caller adds it).
Row i of z attends over its own row (starting node); the ending-node variant runs the
same op on the transposed pair tensor.

`triangle_attention_core` is the O(N^3) attention with the cuEquivariance op's arguments
(q, k, v (B, N, H, N, D), bias (B, 1, H, N, N), boolean mask (B, N, 1, 1, N), scale), so a
kernel can replace it: GatedAttention calls it through the kernel registry (foldmill.kernels).
Parameter names (layer_norm, linear, mha.linear_{q,k,v,g,o}) match the Boltz-2 checkpoint.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from foldmill import kernels

# Additive logit for masked keys. Every key of a padded row is masked; keeping the value
# equal to Boltz-2's keeps even those (unused) rows equal to the reference.
MASK_LOGIT = 1e9


def triangle_attention_core(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, mask: Tensor, scale: float) -> Tensor:
    """softmax(scale * q k^T + mask bias + triangle bias) v, independently for every row.

    q, k, v: (B, I, H, J, D); bias: (B, 1, H, J, J); mask: (B, I, 1, 1, J) bool.
    Returns (B, I, H, J, D).
    """
    logits = torch.matmul(q * scale, k.transpose(-1, -2))
    logits += (mask.to(logits.dtype) - 1.0) * MASK_LOGIT
    logits += bias
    return torch.matmul(logits.softmax(dim=-1), v)


class GatedAttention(nn.Module):
    """Multi-head self-attention with a sigmoid output gate; holds the q/k/v/g/o projections."""

    def __init__(self, c_in: int, c_hidden: int, num_heads: int) -> None:
        super().__init__()
        self.c_hidden = c_hidden
        self.num_heads = num_heads
        width = c_hidden * num_heads
        self.linear_q = nn.Linear(c_in, width, bias=False)
        self.linear_k = nn.Linear(c_in, width, bias=False)
        self.linear_v = nn.Linear(c_in, width, bias=False)
        self.linear_o = nn.Linear(width, c_in, bias=False)
        self.linear_g = nn.Linear(c_in, width, bias=False)

    def _heads(self, x: Tensor) -> Tensor:
        """(B, I, J, H*D) -> (B, I, H, J, D)."""
        return x.view(*x.shape[:-1], self.num_heads, self.c_hidden).transpose(-2, -3)

    def forward(self, x: Tensor, bias: Tensor, mask: Tensor, chunk_size: int | None = None) -> Tensor:
        """x: (B, I, J, C), bias: (B, 1, H, J, J), mask: (B, I, 1, 1, J) bool -> (B, I, J, C)."""
        q = self._heads(self.linear_q(x))
        k = self._heads(self.linear_k(x))
        v = self._heads(self.linear_v(x))
        scale = 1.0 / math.sqrt(self.c_hidden)
        rows = x.shape[1]
        step = rows if chunk_size is None else chunk_size
        # Rows are independent, so chunking over them only bounds the logits' memory.
        out = torch.cat(
            [
                kernels.dispatch(
                    "triangle_attention",
                    triangle_attention_core,
                    q[:, i : i + step],
                    k[:, i : i + step],
                    v[:, i : i + step],
                    bias,
                    mask[:, i : i + step],
                    scale,
                )
                for i in range(0, rows, step)
            ],
            dim=1,
        )
        out = out.transpose(-2, -3)  # (B, I, J, H, D)
        gate = self.linear_g(x).sigmoid().view(*x.shape[:-1], self.num_heads, self.c_hidden)
        return self.linear_o((out * gate).flatten(-2))


class TriangleAttention(nn.Module):
    """Triangle attention; `starting=False` gives the ending-node variant."""

    def __init__(self, c_in: int, c_hidden: int, num_heads: int, starting: bool = True) -> None:
        super().__init__()
        self.starting = starting
        self.layer_norm = nn.LayerNorm(c_in, eps=1e-5)
        self.linear = nn.Linear(c_in, num_heads, bias=False)
        self.mha = GatedAttention(c_in, c_hidden, num_heads)

    def forward(self, x: Tensor, mask: Tensor, chunk_size: int | None = None) -> Tensor:
        """x: (B, N, N, C), mask: (B, N, N); chunk_size bounds rows per attention call."""
        if not self.starting:
            x = x.transpose(-2, -3)
            mask = mask.transpose(-1, -2)
        x = self.layer_norm(x)
        bias = self.linear(x).permute(0, 3, 1, 2).unsqueeze(1)  # (B, 1, H, N, N)
        key_mask = mask[:, :, None, None, :].bool()
        x = self.mha(x, bias, key_mask, chunk_size)
        if not self.starting:
            x = x.transpose(-2, -3)
        return x


class TriangleAttentionStartingNode(TriangleAttention):
    """Each edge ij attends to edges ik, biased by edge jk."""

    def __init__(self, c_in: int, c_hidden: int, num_heads: int) -> None:
        super().__init__(c_in, c_hidden, num_heads, starting=True)


class TriangleAttentionEndingNode(TriangleAttention):
    """Each edge ij attends to edges kj, biased by edge ki."""

    def __init__(self, c_in: int, c_hidden: int, num_heads: int) -> None:
        super().__init__(c_in, c_hidden, num_heads, starting=False)
