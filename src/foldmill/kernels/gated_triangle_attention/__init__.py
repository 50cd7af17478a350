"""The "gated_triangle_attention" op: triangle attention with GatedAttention's output gate (reference:
foldmill.model.layers.triangle_attention.gated_triangle_attention). Backend: the flash kernel with the gate
fused into its store (triton.py). Tokens: the keys of q."""

from __future__ import annotations

from foldmill.kernels import triton_support
from foldmill.kernels.gated_triangle_attention import triton
from foldmill.kernels.registry import CUDA, HALF, Backend, OpSpec, half_precision_order, register_op

register_op(
    "gated_triangle_attention",
    OpSpec(
        tokens=lambda q, *args, **kwargs: q.shape[-2],
        backends=(
            Backend("triton", triton.gated_triangle_attention, CUDA, HALF, triton_support.available, triton.supports),
        ),
        # The backend itself defers to the "triangle_attention" op's choice, so it runs exactly where the
        # flash kernel would.
        default_order=half_precision_order("triton"),
    ),
)
