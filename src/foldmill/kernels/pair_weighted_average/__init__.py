"""The "pair_weighted_average" op: the MSA values averaged with pair weights, times the gate (reference:
foldmill.model.layers.pair_weighted_average). Backend: Triton (triton.py, triton_kernel.py).
Tokens: weights (B, H, N, N)."""

from __future__ import annotations

from foldmill.kernels import triton_support
from foldmill.kernels.pair_weighted_average import triton
from foldmill.kernels.registry import (
    CUDA,
    HALF,
    REFERENCE,
    Backend,
    OpSpec,
    register_op,
    second_to_last_axis,
)

register_op(
    "pair_weighted_average",
    OpSpec(
        tokens=second_to_last_axis,
        backends=(
            Backend("triton", triton.pair_weighted_average, CUDA, HALF, triton_support.available, triton.supports),
        ),
        # The fused average wins only on smaller inputs (the H200's table: up to ~1,200 tokens), so without a
        # measured table the reference runs.
        default_order={"bfloat16": [REFERENCE], "float16": [REFERENCE], "float32": [REFERENCE]},
    ),
)
