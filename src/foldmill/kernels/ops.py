"""The routed ops and their backends (registered on import of foldmill.kernels).

| op                      | reference (foldmill.model.layers)             | backends      | tokens read from |
|-------------------------|-----------------------------------------------|---------------|------------------|
| triangle_multiplication | triangle_multiplicative_update(x, ...)        | cueq          | x (B, N, N, C)   |
| triangle_attention      | triangle_attention_core(q, k, v, bias, ...)   | cueq, sdpa, triton | keys of q   |
| attention_pair_bias     | attention_with_pair_bias(q, k, v, bias, ...)  | sdpa          | keys of k        |
| transition              | transition(x, norm/fc1/fc2/fc3 weights, ...)  | triton        | x (..., N, C)    |
| layer_norm              | layer_norm_in_compute_dtype(x, w, b, eps)     | triton        | x (..., N, C)    |

cuEquivariance's fused `attention_pair_bias` is not routed: it also applies the input
LayerNorm and the q/k/v/g/o projections, a wider boundary than the core function (and the
diffusion transformer normalises with AdaLN instead).
"""

from __future__ import annotations

import torch

from foldmill.kernels import cueq, sdpa, triton_layer_norm, triton_support, triton_transition, triton_triangle_attention
from foldmill.kernels.registry import Backend, OpSpec, register_op

_CUDA = frozenset({"cuda"})
_CPU_AND_CUDA = frozenset({"cpu", "cuda"})
_HALF = frozenset({torch.bfloat16, torch.float16})
_FLOAT = frozenset({torch.bfloat16, torch.float16, torch.float32})

register_op(
    "triangle_multiplication",
    OpSpec(
        tokens=lambda x, *args, **kwargs: x.shape[-2],
        backends=(Backend("cueq", cueq.triangle_multiplicative_update, _CUDA, _HALF, cueq.available),),
    ),
)
register_op(
    "triangle_attention",
    OpSpec(
        tokens=lambda q, *args, **kwargs: q.shape[-2],
        backends=(
            Backend("cueq", cueq.triangle_attention, _CUDA, _HALF, cueq.available),
            Backend("sdpa", sdpa.triangle_attention, _CPU_AND_CUDA, _FLOAT),
            Backend(
                "triton",
                triton_triangle_attention.triangle_attention,
                _CUDA,
                _HALF,
                triton_support.available,
            ),
        ),
    ),
)
register_op(
    "attention_pair_bias",
    OpSpec(
        tokens=lambda q, k, *args, **kwargs: k.shape[1],
        backends=(Backend("sdpa", sdpa.attention_with_pair_bias, _CPU_AND_CUDA, _FLOAT),),
    ),
)
register_op(
    "transition",
    OpSpec(
        # Pair track (B, N, N, C) and single track (B, N, C) alike: the second-to-last axis is tokens.
        tokens=lambda x, *args, **kwargs: x.shape[-2] if x.dim() >= 2 else 1,
        backends=(Backend("triton", triton_transition.transition, _CUDA, _HALF, triton_support.available),),
    ),
)
register_op(
    "layer_norm",
    OpSpec(
        tokens=lambda x, *args, **kwargs: x.shape[-2] if x.dim() >= 2 else 1,
        backends=(Backend("triton", triton_layer_norm.layer_norm, _CUDA, _HALF, triton_support.available),),
    ),
)
