"""The "layer_norm_heads" backend (Triton): a pair's LayerNorm and an attention's bias projection in one
kernel (foldmill.kernels.layer_norm.triton_kernel), the pair read once."""

from __future__ import annotations

from torch import Tensor

from foldmill.kernels.layer_norm.triton import HEAD_BLOCK, MAX_WIDTH
from foldmill.kernels.registry import compute_dtype
from foldmill.kernels.triton_support import padded_width, records_autograd


def supports(
    x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, head_weight: Tensor, keep_normed: bool
) -> bool:
    """Not under autograd, affine weights, a power-of-two width, at most one tile of heads."""
    width = x.shape[-1]
    return not (
        records_autograd(x, weight, bias, head_weight)
        or weight is None
        or bias is None
        or x.dim() != 4
        or padded_width(width) != width
        or width > MAX_WIDTH
        or head_weight.shape[0] > HEAD_BLOCK
    )


def layer_norm_heads(
    x: Tensor, weight: Tensor, bias: Tensor, eps: float, head_weight: Tensor, keep_normed: bool
) -> tuple[Tensor | None, Tensor]:
    """The "layer_norm_heads" backend (where `supports`): one kernel reads the pair once
    for its LayerNorm and the heads' bias projection (the reference writes the norm, reads it back and
    permutes the projection heads first)."""
    from foldmill.kernels.layer_norm.triton_kernel import fused_layer_norm_heads

    return fused_layer_norm_heads(x, weight, bias, eps, head_weight, compute_dtype(x), keep_normed)
