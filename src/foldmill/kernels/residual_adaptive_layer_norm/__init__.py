"""The "residual_adaptive_layer_norm" op of the score model: a += gate * update, then the adaptive
LayerNorm of a (reference: foldmill.model.layers.modulation). Backend: Triton (triton.py; the kernel is
adaptive_layer_norm/triton_kernel.py). Tokens: a (rows, L, D)."""

from __future__ import annotations

from foldmill.kernels import triton_support
from foldmill.kernels.registry import (
    CUDA,
    FLOAT,
    Backend,
    OpSpec,
    half_precision_order,
    register_op,
    second_to_last_axis,
)
from foldmill.kernels.residual_adaptive_layer_norm import triton

register_op(
    "residual_adaptive_layer_norm",
    OpSpec(
        tokens=second_to_last_axis,
        backends=(
            Backend(
                "triton", triton.residual_adaptive_layer_norm, CUDA, FLOAT, triton_support.available, triton.supports
            ),
        ),
        default_order=half_precision_order("triton"),
    ),
)
