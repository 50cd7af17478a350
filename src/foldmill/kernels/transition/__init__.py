"""The "transition" op: the SwiGLU transition, LayerNorm + fc1/fc2 + SiLU gate + fc3 (reference:
foldmill.model.layers.transition). Backend: one fused Triton kernel (triton.py, triton_kernel.py).
Tokens: x (..., N, C)."""

from __future__ import annotations

from foldmill.kernels import triton_support
from foldmill.kernels.registry import (
    CUDA,
    HALF,
    Backend,
    OpSpec,
    half_precision_order,
    register_op,
    second_to_last_axis,
)
from foldmill.kernels.transition import triton

register_op(
    "transition",
    OpSpec(
        tokens=second_to_last_axis,
        backends=(Backend("triton", triton.transition, CUDA, HALF, triton_support.available, triton.supports),),
        # The fused kernel never materialises the 4x-wide hidden layer, so it wins at every size.
        default_order=half_precision_order("triton"),
    ),
)
