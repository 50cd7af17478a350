"""The "triangle_attention" op: the core of triangle attention, softmax(q k^T * scale + bias) v over each
row's keys (reference: foldmill.model.layers.triangle_attention). Backends: cuEquivariance (cueq.py),
PyTorch SDPA (sdpa.py), foldmill's flash kernel (triton.py, triton_kernel.py; also run by the
"gated_triangle_attention" and "attention_pair_bias" ops). Tokens: the keys of q (B, I, H, J, D)."""

from __future__ import annotations

from foldmill.kernels import triton_support
from foldmill.kernels.cueq import available as cueq_available
from foldmill.kernels.registry import CPU_AND_CUDA, CUDA, FLOAT, HALF, REFERENCE, Backend, OpSpec, register_op
from foldmill.kernels.triangle_attention import cueq, sdpa, triton

register_op(
    "triangle_attention",
    OpSpec(
        tokens=lambda q, *args, **kwargs: q.shape[-2],
        backends=(
            Backend("cueq", cueq.triangle_attention, CUDA, HALF, cueq_available),
            Backend("sdpa", sdpa.triangle_attention, CPU_AND_CUDA, FLOAT),
            Backend("triton", triton.triangle_attention, CUDA, HALF, triton_support.available, triton.supports),
        ),
        # cuEquivariance's wins at every measured size on sm_90 where no table says otherwise.
        default_order={
            "bfloat16": ["cueq", "sdpa", REFERENCE],
            "float16": ["cueq", "sdpa", REFERENCE],
            "float32": ["sdpa", REFERENCE],
        },
    ),
)
