"""The "triangle_attention" backend on PyTorch's scaled_dot_product_attention (flash / memory-efficient / cuDNN kernels, picked by PyTorch).

Same arguments and result as the reference (foldmill.model.layers.triangle_attention). The additive bias and
the key mask are folded into one float attention mask in the query's dtype (SDPA requires it),
so in bf16 the bias is rounded to bf16, as under autocast in the reference.
"""

from __future__ import annotations

from torch import Tensor
from torch.nn import functional as F

# Additive logit of masked keys in triangle attention (foldmill.model.layers.triangle_attention).
TRIANGLE_MASK_LOGIT = 1e9


def triangle_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, mask: Tensor, scale: float) -> Tensor:
    """q, k, v: (B, I, H, J, D); bias: (B, 1, H, J, J); mask: (B, I, 1, 1, J) bool -> (B, I, H, J, D)."""
    batch, rows, heads, keys, dim = q.shape
    attn_mask = bias.to(q.dtype) + (mask.to(q.dtype) - 1.0) * TRIANGLE_MASK_LOGIT  # (B, I, H, J, J)
    attn_mask = attn_mask.expand(batch, rows, heads, q.shape[-2], keys).reshape(batch * rows, heads, -1, keys)
    out = F.scaled_dot_product_attention(
        q.reshape(batch * rows, heads, -1, dim),
        k.reshape(batch * rows, heads, keys, dim),
        v.reshape(batch * rows, heads, keys, dim),
        attn_mask=attn_mask,
        scale=scale,
    )
    return out.view(batch, rows, heads, -1, dim)
