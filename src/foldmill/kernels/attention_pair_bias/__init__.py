"""The "attention_pair_bias" op: the single track's attention with a pair bias, softmax(q k^T / sqrt(d) + bias)
v over the unmasked keys (reference: foldmill.model.layers.attention_pair_bias). Backends: PyTorch SDPA
(sdpa.py), the flash triangle attention kernel, heads padded (triton.py). Tokens: the keys of k (B, K, H, D).

cuEquivariance's fused attention_pair_bias is not routed: it also applies the input LayerNorm and the
q/k/v/g/o projections, a wider boundary than this op (and the diffusion transformer normalises with AdaLN
instead)."""

from __future__ import annotations

from foldmill.kernels import triton_support
from foldmill.kernels.attention_pair_bias import sdpa, triton
from foldmill.kernels.registry import CPU_AND_CUDA, CUDA, FLOAT, HALF, REFERENCE, Backend, OpSpec, register_op

register_op(
    "attention_pair_bias",
    OpSpec(
        tokens=lambda q, k, *args, **kwargs: k.shape[1],
        backends=(
            Backend("sdpa", sdpa.attention_pair_bias, CPU_AND_CUDA, FLOAT),
            Backend("triton", triton.attention_pair_bias, CUDA, HALF, triton_support.available),
        ),
        default_order={
            "bfloat16": ["sdpa", REFERENCE],
            "float16": ["sdpa", REFERENCE],
            "float32": ["sdpa", REFERENCE],
        },
    ),
)
