"""Pairformer stacks (AF3 Algorithm 17), with and without the single track.

PairformerLayer / PairformerModule: s (B, N, token_s), z (B, N, N, token_z), token mask
(B, N), pair mask (B, N, N) -> (s, z) of the same shapes.
PairformerNoSeqLayer / PairformerNoSeqModule: z, pair mask -> z (template and MSA stacks).

Pair track per block: z += tri_mul_out, tri_mul_in, tri_att_start, tri_att_end,
transition_z. Single track: s += attention(LN(s), bias from z); s += transition_s;
optional post-LayerNorm. The modules take the checkpoint's hyperparameter dicts as keyword
arguments; training-only options (dropout, activation_checkpointing, no_update_s, and for
the pair-only stack post_layer_norm, which Boltz-2 never applies there) are accepted and
ignored, since this is an inference implementation. Parameter names match the Boltz-2 checkpoint
(layers.{i}.tri_mul_out..., attention, pre_norm_s, transition_s, transition_z, s_post_norm).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from foldmill.model.layers.attention_pair_bias import AttentionPairBias
from foldmill.model.layers.layer_norm import LayerNorm
from foldmill.model.layers.transition import Transition
from foldmill.model.layers.triangle_attention import TriangleAttentionEndingNode, TriangleAttentionStartingNode
from foldmill.model.layers.triangle_multiplication import (
    TriangleMultiplicationIncoming,
    TriangleMultiplicationOutgoing,
)

# Above this many tokens Boltz-2 switches to smaller chunks (const.chunk_size_threshold).
LARGE_INPUT_TOKENS = 384


# Above this many tokens the pair transition runs by token rows, each block's (rows, N, 4 * token_z)
# hidden activations within PAIR_TRANSITION_BLOCK_BYTES (unchunked at 6,000 tokens: 37 GB in bf16 per
# projection). Rows are independent, so the values are the same.
ROW_CHUNKED_TRANSITION_TOKENS = 1024
PAIR_TRANSITION_BLOCK_BYTES = 1 << 30


def pair_transition_rows(num_tokens: int, token_z: int) -> int | None:
    """Token rows per pair-transition call (None: all at once)."""
    if num_tokens <= ROW_CHUNKED_TRANSITION_TOKENS:
        return None
    return max(1, PAIR_TRANSITION_BLOCK_BYTES // (num_tokens * 4 * token_z * 4))


def triangle_attention_chunk_size(num_tokens: int) -> int:
    """Rows per triangle-attention call: Boltz-2's inference policy."""
    return 128 if num_tokens > LARGE_INPUT_TOKENS else 512


class PairformerNoSeqLayer(nn.Module):
    """One pair-only block: triangle updates, triangle attention, transition."""

    def __init__(self, token_z: int, pairwise_head_width: int = 32, pairwise_num_heads: int = 4) -> None:
        super().__init__()
        self.tri_mul_out = TriangleMultiplicationOutgoing(token_z)
        self.tri_mul_in = TriangleMultiplicationIncoming(token_z)
        self.tri_att_start = TriangleAttentionStartingNode(token_z, pairwise_head_width, pairwise_num_heads)
        self.tri_att_end = TriangleAttentionEndingNode(token_z, pairwise_head_width, pairwise_num_heads)
        self.transition_z = Transition(token_z, token_z * 4)

    def update_pair(
        self, z: Tensor, pair_mask: Tensor, chunk_size_tri_attn: int | None = None, in_place: bool = False
    ) -> Tensor:
        """in_place: z is the caller's to overwrite (a stack's own tensor after its first block): the block
        then never holds a second pair tensor (17 GiB in fp32 at 6,000 tokens). The values are the same."""
        # The triangle updates add themselves to z (fused backends save the separate add's pass).
        z = self.tri_mul_out(z, pair_mask, residual_out=z if in_place else torch.empty_like(z))
        # In place from here: z is this block's own tensor.
        z = self.tri_mul_in(z, pair_mask, residual_out=z)
        z = self.tri_att_start(z, pair_mask, chunk_size_tri_attn, residual_out=z)
        z = self.tri_att_end(z, pair_mask, chunk_size_tri_attn, residual_out=z)
        rows = pair_transition_rows(z.shape[1], z.shape[-1])
        if rows is None:
            z += self.transition_z(z)
            return z
        for start in range(0, z.shape[1], rows):
            z[:, start : start + rows] += self.transition_z(z[:, start : start + rows])
        return z

    def forward(
        self, z: Tensor, pair_mask: Tensor, chunk_size_tri_attn: int | None = None, in_place: bool = False
    ) -> Tensor:
        return self.update_pair(z, pair_mask, chunk_size_tri_attn, in_place)


class PairformerLayer(PairformerNoSeqLayer):
    """One full block: the pair-only block's pair updates, then the single track."""

    def __init__(
        self,
        token_s: int,
        token_z: int,
        num_heads: int = 16,
        pairwise_head_width: int = 32,
        pairwise_num_heads: int = 4,
        post_layer_norm: bool = False,
    ) -> None:
        super().__init__(token_z, pairwise_head_width, pairwise_num_heads)
        self.pre_norm_s = LayerNorm(token_s)
        self.attention = AttentionPairBias(token_s, token_z, num_heads)
        self.transition_s = Transition(token_s, token_s * 4)
        self.s_post_norm = LayerNorm(token_s) if post_layer_norm else nn.Identity()

    def forward(  # type: ignore[override]  # the single track adds s and the token mask
        self,
        s: Tensor,
        z: Tensor,
        mask: Tensor,
        pair_mask: Tensor,
        chunk_size_tri_attn: int | None = None,
        in_place: bool = False,
    ) -> tuple[Tensor, Tensor]:
        z = self.update_pair(z, pair_mask, chunk_size_tri_attn, in_place)
        # s and z keep their storage dtype (the caller's residual precision): no per-block copies;
        # the bias projection's LayerNorm reads z as it is.
        s_normed = self.pre_norm_s(s)
        s = s + self.attention(s_normed, z, mask.float(), k_in=s_normed)
        s = s + self.transition_s(s)
        return self.s_post_norm(s), z


class PairformerModule(nn.Module):
    """`num_blocks` PairformerLayers (the 64-block trunk, or the confidence stack)."""

    def __init__(
        self,
        token_s: int,
        token_z: int,
        num_blocks: int,
        num_heads: int = 16,
        pairwise_head_width: int = 32,
        pairwise_num_heads: int = 4,
        post_layer_norm: bool = False,
        **training_options: Any,
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            PairformerLayer(token_s, token_z, num_heads, pairwise_head_width, pairwise_num_heads, post_layer_norm)
            for _ in range(num_blocks)
        )

    def forward(
        self, s: Tensor, z: Tensor, mask: Tensor, pair_mask: Tensor, in_place: bool = False
    ) -> tuple[Tensor, Tensor]:
        """in_place: the input z is the caller's to overwrite (else the first block adds out of place)."""
        chunk_size = triangle_attention_chunk_size(z.shape[1])
        for index, layer in enumerate(self.layers):
            s, z = layer(s, z, mask, pair_mask, chunk_size, in_place=in_place or index > 0)
        return s, z


class PairformerNoSeqModule(nn.Module):
    """`num_blocks` PairformerNoSeqLayers (the template stack)."""

    def __init__(
        self,
        token_z: int,
        num_blocks: int,
        pairwise_head_width: int = 32,
        pairwise_num_heads: int = 4,
        **training_options: Any,
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            PairformerNoSeqLayer(token_z, pairwise_head_width, pairwise_num_heads) for _ in range(num_blocks)
        )

    def forward(self, z: Tensor, pair_mask: Tensor) -> Tensor:
        chunk_size = triangle_attention_chunk_size(z.shape[1])
        for index, layer in enumerate(self.layers):
            z = layer(z, pair_mask, chunk_size, in_place=index > 0)
        return z
