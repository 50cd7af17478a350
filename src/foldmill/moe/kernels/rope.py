"""Triton rotary embedding, forward and backward in one kernel each.

Eager RoPE in the (batch, seq, heads, head_dim) layout costs a concatenation, a negation, two
products and a sum per call, each a full pass over q or k, twice more in the backward pass; this
is one read and one write. The rotation is computed in float32 and rounded once.

y1 = x1 cos - x2 sin,  y2 = x2 cos + x1 sin   (x = [x1 | x2] along head_dim)
The backward pass is the inverse rotation, the same kernel with sin negated (cos and sin tables
repeat their first half in their second, as `model.rope.rope_tables` builds them).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from foldmill.moe.kernels.grid import next_power_of_2


@triton.jit
def _rope_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, seq, heads, cos_stride_b, SIGN: tl.constexpr,
                 BLOCK_H: tl.constexpr, HALF: tl.constexpr):
    token = tl.program_id(0)
    batch, position = token // seq, token % seq
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, HALF)
    mask = offs_h[:, None] < heads
    base = token.to(tl.int64) * heads * (2 * HALF) + offs_h[:, None] * (2 * HALF) + offs_d[None, :]
    x1 = tl.load(x_ptr + base, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + base + HALF, mask=mask, other=0.0).to(tl.float32)
    table = batch.to(tl.int64) * cos_stride_b + position * (2 * HALF) + offs_d
    cos = tl.load(cos_ptr + table)[None, :]
    sin = SIGN * tl.load(sin_ptr + table)[None, :]
    tl.store(out_ptr + base, (x1 * cos - x2 * sin).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(out_ptr + base + HALF, (x2 * cos + x1 * sin).to(out_ptr.dtype.element_ty), mask=mask)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sign: float) -> torch.Tensor:
    x = x.contiguous()
    batch, seq, heads, head_dim = x.shape
    out = torch.empty_like(x)
    cos_stride_b = cos.stride(0) if cos.dim() == 3 else 0
    _rope_kernel[(batch * seq,)](x, cos, sin, out, seq, heads, cos_stride_b, SIGN=sign,
                                 BLOCK_H=next_power_of_2(heads), HALF=head_dim // 2, num_warps=4)
    return out


class RotaryEmbedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _rotate(x, cos, sin, 1.0)

    @staticmethod
    def backward(ctx, grad_out):
        cos, sin = ctx.saved_tensors
        return _rotate(grad_out, cos, sin, -1.0), None, None


def apply_rope_triton(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (batch, seq, heads, head_dim); cos/sin float32 (seq, head_dim) or (batch, seq, head_dim)."""
    return RotaryEmbedding.apply(x, cos.float().contiguous(), sin.float().contiguous())
