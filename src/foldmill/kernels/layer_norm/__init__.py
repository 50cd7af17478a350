"""The "layer_norm" op: LayerNorm with fp32 statistics, output in the compute dtype (reference:
foldmill.model.layers.layer_norm). Backend: Triton (triton.py, triton_kernel.py; the kernel file also holds
the "layer_norm_heads" kernel). Tokens: x (..., N, C)."""

from __future__ import annotations

from foldmill.kernels import triton_support
from foldmill.kernels.layer_norm import triton
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
    "layer_norm",
    OpSpec(
        tokens=second_to_last_axis,
        backends=(Backend("triton", triton.layer_norm, CUDA, HALF, triton_support.available, triton.supports),),
        # PyTorch's layer norm runs a thread block per 128-wide row: 7.1x slower than the Triton kernel on
        # the H200 at 1,024 tokens (1.76 vs 0.25 ms).
        default_order=half_precision_order("triton"),
    ),
)
