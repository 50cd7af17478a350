"""Causal grouped-query self-attention with rotary embeddings, optionally masked by document.

Without document ids: plain causal SDPA (flash on GPU). With them (records packed back to back
in one window): a token attends only to earlier tokens of its own record, and RoPE positions
restart at each record, so a packed window computes what each record would alone. On CUDA the
mask is a FlexAttention block mask (compiled; blocks of other records are skipped, not computed);
elsewhere SDPA with a boolean block-diagonal causal mask, the reference path.

ModelConfig.attention picks the kernels: "torch" (the above) or "flash_attn_4" (FlashAttention 4,
moe/kernels/flash_attention_4.py; CUDA only), which reads the same block mask.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from foldmill.moe.config import ModelConfig
from foldmill.moe.kernels.flash_attention_4 import flash_attention_4
from foldmill.moe.model.projections import project
from foldmill.moe.model.rope import apply_rope

IMPLEMENTATIONS = ("auto", "flex", "sdpa")


@dataclass
class DocumentMask:
    """Which keys each query may see in a window of packed records; built once per batch."""

    positions: torch.Tensor  # (batch, seq) position of each token within its record
    document_ids: torch.Tensor  # (batch, seq) int32, which record each token belongs to
    block_mask: object | None = None  # FlexAttention BlockMask (flex)
    dense: torch.Tensor | None = None  # (batch, 1, seq, seq) bool, True = may attend (sdpa)


def record_starts(document_ids: torch.Tensor) -> torch.Tensor:
    """True where a record starts: each window's first token and every change of document id."""
    starts = torch.ones_like(document_ids, dtype=torch.bool)
    starts[..., 1:] = document_ids[..., 1:] != document_ids[..., :-1]
    return starts


def positions_in_document(document_ids: torch.Tensor) -> torch.Tensor:
    """Index of each token within its run of equal document ids (restarts at every change)."""
    seq = document_ids.shape[-1]
    index = torch.arange(seq, device=document_ids.device).expand_as(document_ids)
    return index - torch.where(record_starts(document_ids), index, 0).cummax(dim=-1).values


def attended_pairs(document_ids: torch.Tensor) -> int:
    """The query-key pairs attention within the records of `document_ids` keeps: each query sees its
    position in its record + 1 keys."""
    return int((positions_in_document(document_ids) + 1).sum())


def document_mask(document_ids: torch.Tensor, implementation: str = "auto") -> DocumentMask:
    """The mask of `document_ids` (batch, seq) for `implementation`: flex (CUDA), sdpa, or auto."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"attention implementation must be one of {IMPLEMENTATIONS}, not {implementation!r}")
    if implementation == "auto":
        # FOLDMILL_DOC_ATTENTION=sdpa takes the dense-mask path on a GPU too (a reference for flex).
        chosen = os.environ.get("FOLDMILL_DOC_ATTENTION", "auto")
        implementation = chosen if chosen in ("flex", "sdpa") else ("flex" if document_ids.is_cuda else "sdpa")
    ids = document_ids.to(torch.int32)
    positions = positions_in_document(ids)
    if implementation == "sdpa":
        seq = ids.shape[-1]
        causal = torch.ones(seq, seq, dtype=torch.bool, device=ids.device).tril()
        dense = (ids.unsqueeze(-1) == ids.unsqueeze(-2)) & causal
        return DocumentMask(positions, ids, dense=dense.unsqueeze(1))
    from torch.nn.attention.flex_attention import create_block_mask

    def same_document_causal(b, h, q, kv):
        return (ids[b, q] == ids[b, kv]) & (q >= kv)

    batch, seq = ids.shape
    # Compiled construction: ~10 ms per 2 x 4,096-token batch uncompiled on the H200, once per step.
    block_mask = create_block_mask(same_document_causal, batch, None, seq, seq, device=ids.device, _compile=True)
    return DocumentMask(positions, ids, block_mask=block_mask)


@functools.cache
def _compiled_flex_attention():
    from torch.nn.attention.flex_attention import flex_attention

    # Uncompiled, flex_attention materializes the scores; compiled it is one fused kernel.
    return torch.compile(flex_attention)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: DocumentMask | None,
           kernels: str = "torch") -> torch.Tensor:
    """q (batch, seq, heads, dim), k/v (batch, seq, kv_heads, dim), as the projections lay them out
    -> (batch, seq, heads, dim); `kernels`: ModelConfig.attention."""
    if kernels == "flash_attn_4":
        if mask is None:
            return flash_attention_4(q, k, v)
        return flash_attention_4(q, k, v, mask.document_ids, mask.block_mask)
    return _torch_attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask).transpose(1, 2)


def _torch_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: DocumentMask | None) -> torch.Tensor:
    """q (batch, heads, seq, dim), k/v (batch, kv_heads, seq, dim) -> (batch, heads, seq, dim)."""
    gqa = k.shape[1] != q.shape[1]
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    if mask.block_mask is not None:
        return _compiled_flex_attention()(q, k, v, block_mask=mask.block_mask, enable_gqa=gqa)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.dense, enable_gqa=gqa)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.kernels = config.attention
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.wq = nn.Linear(config.hidden_size, config.num_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(config.hidden_size, config.num_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(config.hidden_size, config.num_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(config.num_heads * self.head_dim, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: DocumentMask | None = None) -> torch.Tensor:
        """cos/sin (seq, head_dim), or (batch, seq, head_dim) when positions restart per record."""
        batch, seq, _ = x.shape
        q, k, v = project(x, [self.wq.weight, self.wk.weight, self.wv.weight])
        q = q.view(batch, seq, self.num_heads, self.head_dim)
        k = k.view(batch, seq, self.num_kv_heads, self.head_dim)
        v = v.view(batch, seq, self.num_kv_heads, self.head_dim)
        # Rotated in the projections' own (batch, seq, heads, dim) layout: contiguous, so the
        # elementwise kernels vectorize.
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = attend(q, k, v, mask, self.kernels)
        return self.wo(out.reshape(batch, seq, -1))
