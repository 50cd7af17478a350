"""Rotary position embeddings (rotate-half convention)."""

from __future__ import annotations

import torch

from foldmill.moe.kernels import use_triton


def rope_tables(head_dim: int, max_seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables, (max_seq_len, head_dim) float32."""
    inverse_frequency = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float64), inverse_frequency)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (batch, seq, heads, head_dim) rotated by position, in x's dtype; cos/sin (seq, head_dim), or
    (batch, seq, head_dim) when positions restart per record. On CUDA one fused Triton kernel
    (rotation in float32, rounded once); elsewhere in x's dtype."""
    # Under torch.compile the eager formula is traced and fused by the compiler instead.
    if use_triton(x) and x.dim() == 4 and not torch.compiler.is_compiling():
        from foldmill.moe.kernels.rope import apply_rope_triton

        return apply_rope_triton(x, cos, sin)
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # broadcast over heads
    first, second = x.chunk(2, dim=-1)
    rotated = torch.cat([-second, first], dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)
