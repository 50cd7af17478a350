"""The "triangle_multiplication" op: the triangle multiplicative update of the pair (reference:
foldmill.model.layers.triangle_multiplication). Backends: cuEquivariance's fused op (cueq.py), foldmill's
Triton kernels (triton.py, triton_kernel.py). Tokens: x (B, N, N, C)."""

from __future__ import annotations

from foldmill.kernels import triton_support
from foldmill.kernels.cueq import available as cueq_available
from foldmill.kernels.registry import CUDA, HALF, REFERENCE, Backend, OpSpec, register_op
from foldmill.kernels.triangle_multiplication import cueq, triton
from foldmill.kernels.triangle_multiplication.weights import TriangleMultiplicationWeights, with_residual

__all__ = ["TriangleMultiplicationWeights", "with_residual"]

register_op(
    "triangle_multiplication",
    OpSpec(
        tokens=lambda x, *args, **kwargs: x.shape[-2],
        backends=(
            Backend("cueq", cueq.triangle_multiplication, CUDA, HALF, cueq_available),
            Backend("triton", triton.triangle_multiplication, CUDA, HALF, triton_support.available, triton.supports),
        ),
        # Without a measured table the reference: cuEquivariance's wins only from ~512 tokens on sm_90.
        default_order={"bfloat16": [REFERENCE], "float16": [REFERENCE], "float32": [REFERENCE]},
    ),
)
