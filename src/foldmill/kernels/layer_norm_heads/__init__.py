"""The "layer_norm_heads" op: a pair's LayerNorm and an attention's bias projection, heads first (reference:
foldmill.model.layers.layer_norm.layer_norm_heads). Backend: Triton (triton.py; its kernel is in
layer_norm/triton_kernel.py). Tokens: x (B, I, J, C)."""

from __future__ import annotations

from foldmill.kernels import triton_support
from foldmill.kernels.layer_norm_heads import triton
from foldmill.kernels.registry import (
    CUDA,
    HALF,
    Backend,
    OpSpec,
    half_precision_order,
    register_op,
    second_to_last_axis,
)

register_op(
    "layer_norm_heads",
    OpSpec(
        tokens=second_to_last_axis,
        backends=(Backend("triton", triton.layer_norm_heads, CUDA, HALF, triton_support.available, triton.supports),),
        # The pair read once instead of the norm written, read back and the projection permuted heads first.
        default_order=half_precision_order("triton"),
    ),
)
