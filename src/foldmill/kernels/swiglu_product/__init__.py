"""The "swiglu_product" op of the score model: silu(gates) * x * y of h = [gates | x | y] (reference:
foldmill.model.layers.modulation). Backend: Triton (triton.py, triton_kernel.py). Tokens: h (rows, L, 3I)."""

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
from foldmill.kernels.swiglu_product import triton

register_op(
    "swiglu_product",
    OpSpec(
        tokens=second_to_last_axis,
        backends=(Backend("triton", triton.swiglu_product, CUDA, FLOAT, triton_support.available, triton.supports),),
        default_order=half_precision_order("triton"),
    ),
)
