"""Triangle multiplicative update ("outgoing" and "incoming" edges), AF3 Algorithms 12/13.

Input z (B, N, N, D) and pair mask (B, N, N) -> update (B, N, N, D) (the caller adds it).

The whole op is the plain function `triangle_multiplicative_update`, with the same
arguments as cuEquivariance's fused op, so a kernel can replace it one-for-one; its
O(N^3) core is `triangle_product`. The modules call it through the kernel registry
(foldmill.kernels), which may run cuEquivariance's fused op instead. Parameter names
(norm_in, p_in, g_in, norm_out, p_out, g_out) match the Boltz-2 checkpoint.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from foldmill import kernels

Direction = Literal["outgoing", "incoming"]

# Edge contraction: outgoing combines edges i->k and j->k, incoming edges k->i and k->j.
_PRODUCT_EQUATION = {"outgoing": "bikd,bjkd->bijd", "incoming": "bkid,bkjd->bijd"}


def triangle_product(a: Tensor, b: Tensor, direction: Direction) -> Tensor:
    """The cubic core: a, b (B, N, N, D) -> (B, N, N, D), summed over the third node k."""
    return torch.einsum(_PRODUCT_EQUATION[direction], a, b)


def triangle_multiplicative_update(
    x: Tensor,
    direction: Direction,
    mask: Tensor,
    norm_in_weight: Tensor,
    norm_in_bias: Tensor,
    p_in_weight: Tensor,
    g_in_weight: Tensor,
    norm_out_weight: Tensor,
    norm_out_bias: Tensor,
    p_out_weight: Tensor,
    g_out_weight: Tensor,
    eps: float = 1e-5,
) -> Tensor:
    """Reference fp32 triangle multiplication: gated projections, masked edge product, gated output."""
    dim = x.shape[-1]
    x = F.layer_norm(x, (dim,), norm_in_weight, norm_in_bias, eps)
    x_normed = x
    edges = F.linear(x, p_in_weight) * F.linear(x, g_in_weight).sigmoid()
    edges = edges * mask.unsqueeze(-1)
    a, b = torch.chunk(edges.float(), 2, dim=-1)
    x = triangle_product(a, b, direction)
    x = F.layer_norm(x, (dim,), norm_out_weight, norm_out_bias, eps)
    return F.linear(x, p_out_weight) * F.linear(x_normed, g_out_weight).sigmoid()


class _TriangleMultiplication(nn.Module):
    direction: Direction

    def __init__(self, dim: int = 128) -> None:
        super().__init__()
        self.norm_in = nn.LayerNorm(dim, eps=1e-5)
        self.p_in = nn.Linear(dim, 2 * dim, bias=False)
        self.g_in = nn.Linear(dim, 2 * dim, bias=False)
        self.norm_out = nn.LayerNorm(dim, eps=1e-5)
        self.p_out = nn.Linear(dim, dim, bias=False)
        self.g_out = nn.Linear(dim, dim, bias=False)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        """x: (B, N, N, D), mask: (B, N, N) -> (B, N, N, D)."""
        return kernels.dispatch(
            "triangle_multiplication",
            triangle_multiplicative_update,
            x,
            self.direction,
            mask,
            self.norm_in.weight,
            self.norm_in.bias,
            self.p_in.weight,
            self.g_in.weight,
            self.norm_out.weight,
            self.norm_out.bias,
            self.p_out.weight,
            self.g_out.weight,
            eps=self.norm_in.eps,
        )


class TriangleMultiplicationOutgoing(_TriangleMultiplication):
    """Update edge ij from edges ik and jk."""

    direction: Direction = "outgoing"


class TriangleMultiplicationIncoming(_TriangleMultiplication):
    """Update edge ij from edges ki and kj."""

    direction: Direction = "incoming"
