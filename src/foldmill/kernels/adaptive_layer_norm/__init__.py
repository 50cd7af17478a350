"""The "adaptive_layer_norm" op of the score model: LN(a) * scale + shift, with the terms shared by a
record's samples (reference: foldmill.model.layers.modulation). Backend: Triton (triton.py,
triton_kernel.py; the kernel also serves "residual_adaptive_layer_norm"). Tokens: a (rows, L, D)."""

from __future__ import annotations

from foldmill.kernels import triton_support
from foldmill.kernels.adaptive_layer_norm import triton
from foldmill.kernels.registry import (
    CUDA,
    FLOAT,
    Backend,
    OpSpec,
    half_precision_order,
    register_op,
    second_to_last_axis,
)

register_op(
    "adaptive_layer_norm",
    OpSpec(
        tokens=second_to_last_axis,
        backends=(
            Backend("triton", triton.adaptive_layer_norm, CUDA, FLOAT, triton_support.available, triton.supports),
        ),
        # One kernel in place of a chain of 3-5 PyTorch kernels and their extra passes.
        default_order=half_precision_order("triton"),
    ),
)
