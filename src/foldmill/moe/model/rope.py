"""Rotary position embeddings (rotate-half convention)."""

from __future__ import annotations

import torch


def rope_tables(head_dim: int, max_seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables, (max_seq_len, head_dim) float32."""
    inverse_frequency = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float64), inverse_frequency)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (..., head_dim) rotated by position, in x's dtype; cos/sin (seq, head_dim) broadcast against x
    (unsqueezed to (seq, 1, head_dim) for x laid out (batch, seq, heads, head_dim))."""
    first, second = x.chunk(2, dim=-1)
    rotated = torch.cat([-second, first], dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)
