"""Causal grouped-query self-attention with rotary embeddings through SDPA (flash on GPU)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from foldmill.moe.config import ModelConfig
from foldmill.moe.model.rope import apply_rope


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.wq = nn.Linear(config.hidden_size, config.num_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(config.hidden_size, config.num_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(config.hidden_size, config.num_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(config.num_heads * self.head_dim, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q = self.wq(x).view(batch, seq, self.num_heads, self.head_dim)
        k = self.wk(x).view(batch, seq, self.num_kv_heads, self.head_dim)
        v = self.wv(x).view(batch, seq, self.num_kv_heads, self.head_dim)
        # Rotated in the projections' own (batch, seq, heads, dim) layout: contiguous, so the
        # elementwise kernels vectorize; SDPA then takes (batch, heads, seq, dim) views.
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q, k = apply_rope(q, cos, sin).transpose(1, 2), apply_rope(k, cos, sin).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v.transpose(1, 2), is_causal=True,
                                             enable_gqa=self.num_kv_heads != self.num_heads)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))
