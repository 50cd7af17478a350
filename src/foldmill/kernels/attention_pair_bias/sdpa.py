"""The "attention_pair_bias" backend on PyTorch's scaled_dot_product_attention (flash / memory-efficient /
cuDNN kernels, picked by PyTorch). The additive bias and the key mask are folded into one float attention
mask in the query's dtype (SDPA requires it)."""

from __future__ import annotations

from torch import Tensor
from torch.nn import functional as F


def attention_pair_bias(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, mask: Tensor, inf: float) -> Tensor:
    """q: (B, S, H, D); k, v: (B, K, H, D); bias: (B, H, S, K); mask: (B, K) -> (B, S, H, D)."""
    attn_mask = bias.to(q.dtype) + (1.0 - mask[:, None, None].to(q.dtype)) * -inf
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=attn_mask, scale=q.shape[-1] ** -0.5
    )
    return out.transpose(1, 2).to(v.dtype)
