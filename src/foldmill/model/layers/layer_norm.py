"""LayerNorm with fp32 statistics whose output has the compute dtype (the "layer_norm" routed op).

Under bf16 autocast a plain LayerNorm reads the fp32 residual stream, computes in fp32 and returns
fp32, which the next projection converts to bf16 again: one more pass over the pair per norm.
This op returns the compute dtype directly (autocast's where it is on, else the input's).
`normed_and_heads` is a pair's LayerNorm with an attention's bias projection (the "layer_norm_heads"
op where the norm is the fast path's compute-dtype LayerNorm).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from foldmill import kernels
from foldmill.kernels.registry import compute_dtype


def layer_norm_in_compute_dtype(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor:
    """LayerNorm over the last axis, fp32 statistics, result in the compute dtype.

    An input already in the compute dtype is normalised by CUDA's kernel in that dtype (it
    accumulates in fp32; `weight`/`bias` are cast to x's dtype where they differ: callers on a hot
    path pass them cast once), otherwise in fp32 and rounded once.
    """
    out_dtype = compute_dtype(x)
    with torch.autocast(x.device.type, enabled=False):
        if x.dtype == out_dtype:
            weight, bias = (None if p is None else p.to(x.dtype) for p in (weight, bias))
            return F.layer_norm(x, x.shape[-1:], weight, bias, eps)
        return F.layer_norm(x.float(), x.shape[-1:], weight, bias, eps).to(out_dtype)


def layer_norm_heads(
    x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, head_weight: Tensor, keep_normed: bool
) -> tuple[Tensor | None, Tensor]:
    """(layer_norm_in_compute_dtype(x), or None without keep_normed; its projection by head_weight (H, C)
    heads first: (B, H, I, J), contiguous) for a pair x (B, I, J, C)."""
    normed = layer_norm_in_compute_dtype(x, weight, bias, eps)
    heads = F.linear(normed, head_weight).permute(0, 3, 1, 2).contiguous()
    return (normed if keep_normed else None), heads


def normed_and_heads(
    norm: nn.Module, projection: nn.Linear, x: Tensor, keep_normed: bool = True
) -> tuple[Tensor | None, Tensor]:
    """(norm(x), or None without keep_normed; projection(norm(x)) heads first, (B, H, I, J) contiguous) for a
    pair x (B, I, J, C): an attention's LayerNorm and pair-bias projection. A norm with a `with_heads` method
    (the fast path's compute-dtype LayerNorm) makes both in one op; any other runs the two modules."""
    with_heads = getattr(norm, "with_heads", None)
    if with_heads is not None and projection.bias is None:
        return with_heads(x, projection.weight, keep_normed)
    normed = norm(x)
    return (normed if keep_normed else None), projection(normed).permute(0, 3, 1, 2).contiguous()


# The plain PyTorch implementations the kernel registry runs where no backend applies.
kernels.register_reference("layer_norm", layer_norm_in_compute_dtype)
kernels.register_reference("layer_norm_heads", layer_norm_heads)
