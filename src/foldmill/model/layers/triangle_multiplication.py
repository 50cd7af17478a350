"""Triangle multiplicative update ("outgoing" and "incoming" edges), AF3 Algorithms 12/13.

Input z (B, N, N, D) and pair mask (B, N, N) -> update (B, N, N, D); with `residual_out`, z + update
written into it (the pairformer passes z itself, so a fused backend adds in its own pass).

The whole op is the plain function `triangle_multiplication`, with the same
arguments as cuEquivariance's fused op (plus `residual_out`), so a kernel can replace it one-for-one;
its O(N^3) core is `triangle_product`. The modules call it through the kernel registry
(foldmill.kernels), which may run foldmill's Triton backend or cuEquivariance's fused op instead, up
to ROW_BLOCKED_TOKENS tokens; above, `triangle_multiplication_by_rows` bounds the working set
(see there). Parameter names (norm_in, p_in, g_in, norm_out, p_out, g_out) match the Boltz-2 checkpoint.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from foldmill import kernels
from foldmill.kernels.registry import compute_dtype
from foldmill.kernels.token_rows import rows_per_block
from foldmill.kernels.triangle_multiplication import TriangleMultiplicationWeights, with_residual
from foldmill.model.layers.layer_norm import LayerNorm

Direction = Literal["outgoing", "incoming"]

# Edge contraction: outgoing combines edges i->k and j->k, incoming edges k->i and k->j.
_PRODUCT_EQUATION = {"outgoing": "bikd,bjkd->bijd", "incoming": "bkid,bkjd->bijd"}


def triangle_product(a: Tensor, b: Tensor, direction: Direction) -> Tensor:
    """The cubic core: a, b (B, N, N, D) -> (B, N, N, D), summed over the third node k."""
    return torch.einsum(_PRODUCT_EQUATION[direction], a, b)


def triangle_multiplication(
    x: Tensor,
    direction: Direction,
    mask: Tensor,
    weights: TriangleMultiplicationWeights,
    residual_out: Tensor | None = None,
) -> Tensor:
    """Reference fp32 triangle multiplication: gated projections, masked edge product, gated output
    (with `residual_out`, added to x: see `with_residual`)."""
    dim, w, eps = x.shape[-1], weights, weights.eps
    normed = F.layer_norm(x, (dim,), w.norm_in_weight, w.norm_in_bias, eps)
    edges = F.linear(normed, w.p_in_weight) * F.linear(normed, w.g_in_weight).sigmoid()
    edges = edges * mask.unsqueeze(-1)
    a, b = torch.chunk(edges.float(), 2, dim=-1)
    product = F.layer_norm(triangle_product(a, b, direction), (dim,), w.norm_out_weight, w.norm_out_bias, eps)
    update = F.linear(product, w.p_out_weight) * F.linear(normed, w.g_out_weight).sigmoid()
    return with_residual(x, update, residual_out)


kernels.register_reference("triangle_multiplication", triangle_multiplication)

# Above this many tokens the update runs by_rows. cuEquivariance's fused op is ~4x faster but holds
# about 8 pair-sized compute-dtype temporaries: measured on the H200 (128 channels), 2.0 GiB at 1,024
# tokens, 8.0 at 2,048, 18.0 at 3,072 (2.1, 9.3, 24.3 ms), so ~69 GiB at 6,000, where it ran the GPU
# out of memory; by_rows held 1.6, 3.8 and 7.1 GiB (8.1, 35, 91-134 ms). foldmill's Triton backend holds
# 3 (a, b and their product; 12 GiB at 4,096 tokens).
ROW_BLOCKED_TOKENS = 4096
# Pairs per row block of by_rows: its fp32 (rows, N, 4 * 128) projection blocks stay within 512 MiB.
ROW_BLOCK_PAIRS = 1 << 18


def triangle_multiplication_by_rows(
    x: Tensor,
    direction: Direction,
    mask: Tensor,
    weights: TriangleMultiplicationWeights,
    rows: int | None = None,
) -> Tensor:
    """`triangle_multiplication` by blocks of `rows` token rows (default: ROW_BLOCK_PAIRS pairs).

    The gated edges a, b are written block by block into two (B, D, N, N) tensors in the compute
    dtype, laid out so the edge product is one batched matrix product per channel whose left operand
    has the output's rows as rows (a as is for outgoing, transposed for incoming: row slices of a
    transposed operand ran incoming 1.5x slower than outgoing on the H200); then each output row
    block is that product's rows, normalised, projected and gated (the input LayerNorm recomputed
    for the gate). Beyond x, it holds a, b and the output: 3 pair tensors in the compute dtype, and
    blocks. Same values as the reference up to summation order.
    """
    batch, tokens, _, dim = x.shape
    w, eps = weights, weights.eps
    rows = rows or rows_per_block(tokens, ROW_BLOCK_PAIRS)
    dtype = compute_dtype(x)
    # a_rows[b, d, i, k] is the left operand's (i, k) entry: a[i, k] (outgoing) or a[k, i] (incoming);
    # b_t[b, d, p, q] = b[p, q]. Then out[:, :, i] = a_rows[:, :, i] @ (b_t^T outgoing, b_t incoming).
    a_rows = x.new_empty((batch, dim, tokens, tokens), dtype=dtype)
    b_t = torch.empty_like(a_rows)
    in_weight = torch.cat([w.p_in_weight, w.g_in_weight])

    def layer_norm(y: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        return kernels.dispatch("layer_norm", y, weight, bias, eps)

    def normed_rows(block: slice) -> Tensor:
        return layer_norm(x[:, block], w.norm_in_weight, w.norm_in_bias)

    for start in range(0, tokens, rows):
        block = slice(start, start + rows)
        projected, gate = F.linear(normed_rows(block), in_weight).chunk(2, dim=-1)
        a, b = (projected * gate.sigmoid() * mask[:, block, :, None]).chunk(2, dim=-1)  # (B, rows, N, D) each
        if direction == "outgoing":
            a_rows[:, :, block] = a.permute(0, 3, 1, 2)
        else:
            a_rows[:, :, :, block] = a.permute(0, 3, 2, 1)
        b_t[:, :, block] = b.permute(0, 3, 1, 2)
    right = b_t.transpose(-1, -2) if direction == "outgoing" else b_t

    out = x.new_empty(x.shape, dtype=dtype)
    for start in range(0, tokens, rows):
        block = slice(start, start + rows)
        product = torch.matmul(a_rows[:, :, block], right)  # (B, D, rows, N)
        normed = layer_norm(product.permute(0, 2, 3, 1), w.norm_out_weight, w.norm_out_bias)
        gate = F.linear(normed_rows(block), w.g_out_weight).sigmoid()
        out[:, block] = F.linear(normed, w.p_out_weight) * gate
    return out


class _TriangleMultiplication(nn.Module):
    direction: Direction

    def __init__(self, dim: int = 128) -> None:
        super().__init__()
        self.norm_in = LayerNorm(dim, eps=1e-5)
        self.p_in = nn.Linear(dim, 2 * dim, bias=False)
        self.g_in = nn.Linear(dim, 2 * dim, bias=False)
        self.norm_out = LayerNorm(dim, eps=1e-5)
        self.p_out = nn.Linear(dim, dim, bias=False)
        self.g_out = nn.Linear(dim, dim, bias=False)

    def forward(self, x: Tensor, mask: Tensor, residual_out: Tensor | None = None) -> Tensor:
        """x: (B, N, N, D), mask: (B, N, N) -> the update (B, N, N, D); with `residual_out` (x itself, or a
        tensor like x), x + update written into it (a fused backend saves the add's pass over x)."""
        weights = TriangleMultiplicationWeights(
            self.norm_in.weight,
            self.norm_in.bias,
            self.p_in.weight,
            self.g_in.weight,
            self.norm_out.weight,
            self.norm_out.bias,
            self.p_out.weight,
            self.g_out.weight,
            self.norm_in.eps,
        )
        if x.shape[1] > ROW_BLOCKED_TOKENS:
            update = triangle_multiplication_by_rows(x, self.direction, mask, weights)
            return with_residual(x, update, residual_out)
        return kernels.dispatch("triangle_multiplication", x, self.direction, mask, weights, residual_out=residual_out)


class TriangleMultiplicationOutgoing(_TriangleMultiplication):
    """Update edge ij from edges ik and jk."""

    direction: Direction = "outgoing"


class TriangleMultiplicationIncoming(_TriangleMultiplication):
    """Update edge ij from edges ki and kj."""

    direction: Direction = "incoming"
