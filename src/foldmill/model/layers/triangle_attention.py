"""Triangle self-attention around the starting / ending node, AF3 Algorithms 14/15.

Input z (B, N, N, C) and pair mask (B, N, N) -> update (B, N, N, C) (the caller adds it), or with
`residual_out` z + update written there (the output projection then accumulates into the pair itself,
see add_projection). Row i of z attends over its own row (starting node); the ending-node variant runs
the same op on the transposed pair tensor.

`triangle_attention` is the O(N^3) attention with the cuEquivariance op's arguments
(q, k, v (B, N, H, N, D), bias (B, 1, H, N, N), boolean mask (B, N, 1, 1, N), scale), so a
kernel can replace it: GatedAttention calls it through the kernel registry (foldmill.kernels).
Parameter names (layer_norm, linear, mha.linear_{q,k,v,g,o}) match the Boltz-2 checkpoint.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from foldmill import kernels
from foldmill.kernels.token_rows import by_token_rows
from foldmill.model.layers.layer_norm import LayerNorm, normed_and_heads

# Additive logit for masked keys. Every key of a padded row is masked; keeping the value
# equal to Boltz-2's keeps even those (unused) rows equal to the reference.
MASK_LOGIT = 1e9

# Largest (q | k | v | g) projection made at once; beyond it, blocks of rows (see TriangleAttention).
# A block's temporaries (projection, attention output, gate, output projection) are ~1.8x this: the
# trunk's largest at 1,000 tokens unblocked (1.8 GiB), ~0.9 GiB at this size.
PROJECTION_BLOCK_BYTES = 512 << 20


def triangle_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, mask: Tensor, scale: float) -> Tensor:
    """softmax(scale * q k^T + mask bias + triangle bias) v, independently for every row.

    q, k, v: (B, I, H, J, D); bias: (B, 1, H, J, J); mask: (B, I, 1, 1, J) bool.
    Returns (B, I, H, J, D).
    """
    logits = torch.matmul(q * scale, k.transpose(-1, -2))
    logits += (mask.to(logits.dtype) - 1.0) * MASK_LOGIT
    logits += bias
    return torch.matmul(logits.softmax(dim=-1), v)


def gated_triangle_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor,
    mask: Tensor,
    scale: float,
    gate: Tensor,
    chunk_size: int | None,
    prepared: dict | None = None,
) -> Tensor:
    """sigmoid(gate) * triangle_attention(...), in the gate's (B, I, J, H*D) layout.

    The attention runs through the "triangle_attention" op, `chunk_size` rows per call (Boltz-2's bound
    on the logits' memory); the "gated_triangle_attention" op's flash backend fuses all of it.
    `prepared`: a dict the caller keeps for the calls on one bias (the row blocks of one module call), where
    a backend may keep what it makes of the bias once (the reference keeps nothing).
    """
    rows = q.shape[1]
    out = by_token_rows(
        lambda block: kernels.dispatch(
            "triangle_attention", q[:, block], k[:, block], v[:, block], bias,
            mask[:, block], scale,
        ),
        rows,
        rows if chunk_size is None else chunk_size,
    )  # fmt: skip
    # The gate in the (B, I, J, H*D) layout linear_o reads: one new tensor, multiplied in place.
    heads, head_dim = q.shape[2], q.shape[-1]
    return gate.sigmoid().view(*gate.shape[:-1], heads, head_dim).mul_(out.transpose(-2, -3)).flatten(-2)


def add_projection(residual: Tensor, gated: Tensor, weight: Tensor) -> None:
    """residual += gated @ weight^T, in place. residual: (B, R, J, C), channels contiguous (a block of
    rows of the pair, or of its transpose); gated: (B, R, J, H*D), contiguous.

    A half-precision product into an fp32 residual is one cuBLAS call that accumulates into it (fp32
    output, the residual as its C operand): no half-precision update tensor and no separate add pass,
    which at 2,472 tokens cost 3.7 ms (starting node) / 4.6 ms (ending node, a transposed add) against
    2.7 ms on the H200. The update is then not rounded to half precision before the add.
    Elsewhere (CPU, fp32) the reference: the product, then the add."""
    fused = residual.is_cuda and residual.dtype == torch.float32 and gated.dtype in (torch.bfloat16, torch.float16)
    if not fused or weight.dtype != gated.dtype:
        residual += F.linear(gated, weight)
        return
    with torch.autocast("cuda", enabled=False):  # autocast would cast the fp32 residual down
        for target, update in zip(residual, gated, strict=True):  # per batch element: (R, J, C)
            if target.is_contiguous():  # rows of the pair: one (R * J, C) product
                flat = target.view(-1, target.shape[-1])
                torch.addmm(flat, update.view(-1, update.shape[-1]), weight.t(), out_dtype=flat.dtype, out=flat)
            else:  # rows of the transpose: column j of the block is a contiguous (R, C) matrix of the pair
                columns = target.transpose(0, 1)
                weights = weight.t().expand(columns.shape[0], *weight.t().shape)
                torch.baddbmm(columns, update.transpose(0, 1), weights, out_dtype=columns.dtype, out=columns)


def projection_block_rows(batch: int, tokens: int, width: int, element_size: int) -> int:
    """Rows i of the (B, N, N, width) projection made at once within PROJECTION_BLOCK_BYTES (at least one):
    all rows up to ~700 tokens in bf16, 87 rows at 6,000 tokens."""
    return max(1, PROJECTION_BLOCK_BYTES // (batch * tokens * width * element_size))


class GatedAttention(nn.Module):
    """Multi-head self-attention with a sigmoid output gate; holds the q/k/v/g/o projections.

    The input projections are applied by the caller (TriangleAttention) as one matrix product of
    the four weights concatenated; `gated_attention` takes their (q | k | v | g) result, and the caller
    applies linear_o (or accumulates it into the pair: add_projection).
    """

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

    def projection_weights(self) -> list[Tensor]:
        """The q, k, v, g weights in the order `forward` reads their products."""
        return [self.linear_q.weight, self.linear_k.weight, self.linear_v.weight, self.linear_g.weight]

    def _heads(self, x: Tensor) -> Tensor:
        """(B, I, J, H*D) -> (B, I, H, J, D)."""
        return x.view(*x.shape[:-1], self.num_heads, self.c_hidden).transpose(-2, -3)

    def gated_attention(
        self, projected: Tensor, bias: Tensor, mask: Tensor, chunk_size: int | None = None, prepared: dict | None = None
    ) -> Tensor:
        """projected: (B, I, J, 4*H*D) = x @ [q|k|v|g]^T, bias: (B, 1, H, J, J), mask: (B, I, 1, 1, J) bool
        -> the gated attention before the output projection, (B, I, J, H*D). chunk_size: rows per attention
        call (a flash backend needs none); `prepared`: see gated_triangle_attention."""
        q, k, v, gate = projected.chunk(4, dim=-1)
        q, k, v = self._heads(q), self._heads(k), self._heads(v)
        scale = 1.0 / math.sqrt(self.c_hidden)
        return kernels.dispatch(
            "gated_triangle_attention", q, k, v, bias, mask, scale, gate, chunk_size,
            prepared,
        )  # fmt: skip


class TriangleAttention(nn.Module):
    """Triangle attention; `starting=False` gives the ending-node variant.

    LN(x) is projected to q, k, v and the gate by one matrix product (their weights concatenated
    per call: a few hundred KB, so never stale after load_state_dict) instead of four that each
    re-read the (B, N, N, C) pair. That product is 4x wider than the pair (37 GB in bf16 at 6,000
    tokens), so above PROJECTION_BLOCK_BYTES it is made, used and dropped one block of rows at a time.
    """

    def __init__(self, c_in: int, c_hidden: int, num_heads: int, starting: bool = True) -> None:
        super().__init__()
        self.starting = starting
        self.layer_norm = LayerNorm(c_in, eps=1e-5)
        self.linear = nn.Linear(c_in, num_heads, bias=False)
        self.mha = GatedAttention(c_in, c_hidden, num_heads)

    def forward(
        self, x: Tensor, mask: Tensor, chunk_size: int | None = None, residual_out: Tensor | None = None
    ) -> Tensor:
        """x: (B, N, N, C), mask: (B, N, N); chunk_size bounds rows per attention call. Returns the update,
        or with `residual_out` (x itself, or a tensor like x) x + update written there."""
        pair = x
        if not self.starting:
            x = x.transpose(-2, -3)
            mask = mask.transpose(-1, -2)
        # The norm is a new tensor (residual_out may be x's own storage); the bias (B, 1, H, N, N) has its keys
        # contiguous once per layer (kernels read it once per row block).
        x, bias = normed_and_heads(self.layer_norm, self.linear, x)
        bias = bias.unsqueeze(1)
        key_mask = mask[:, :, None, None, :].bool()
        weight = torch.cat(self.mha.projection_weights())
        rows = projection_block_rows(x.shape[0], x.shape[2], weight.shape[0], x.element_size())
        prepared: dict = {}  # what the attention backend makes of the bias once, for every block

        def gated(block: slice) -> Tensor:
            projected = F.linear(x[:, block], weight)
            return self.mha.gated_attention(projected, bias, key_mask[:, block], chunk_size, prepared)

        if residual_out is None:
            out = by_token_rows(lambda block: self.mha.linear_o(gated(block)), x.shape[1], rows)
            return out if self.starting else out.transpose(-2, -3)
        if residual_out is not pair:
            residual_out.copy_(pair)
        target = residual_out if self.starting else residual_out.transpose(-2, -3)
        for start in range(0, x.shape[1], rows):
            block = slice(start, start + rows)
            add_projection(target[:, block], gated(block), self.mha.linear_o.weight)
        return residual_out


class TriangleAttentionStartingNode(TriangleAttention):
    """Each edge ij attends to edges ik, biased by edge jk."""

    def __init__(self, c_in: int, c_hidden: int, num_heads: int) -> None:
        super().__init__(c_in, c_hidden, num_heads, starting=True)


class TriangleAttentionEndingNode(TriangleAttention):
    """Each edge ij attends to edges kj, biased by edge ki."""

    def __init__(self, c_in: int, c_hidden: int, num_heads: int) -> None:
        super().__init__(c_in, c_hidden, num_heads, starting=False)


# The plain PyTorch implementations the kernel registry runs where no backend applies.
kernels.register_reference("triangle_attention", triangle_attention)
kernels.register_reference("gated_triangle_attention", gated_triangle_attention)
