"""The routed ops and their backends (registered on import of foldmill.kernels).

| op                      | reference (foldmill.model.layers)             | backends      | tokens read from |
|-------------------------|-----------------------------------------------|---------------|------------------|
| triangle_multiplication | triangle_multiplicative_update(x, ...)        | cueq, triton  | x (B, N, N, C)   |
| triangle_attention      | triangle_attention_core(q, k, v, bias, ...)   | cueq, sdpa, triton | keys of q   |
| gated_triangle_attention | gated_triangle_attention(q, ..., gate, ...)  | triton (fused gate) | keys of q  |
| attention_pair_bias     | attention_with_pair_bias(q, k, v, bias, ...)  | sdpa, triton  | keys of k        |
| transition              | transition(x, norm/fc1/fc2/fc3 weights, ...)  | triton        | x (..., N, C)    |
| layer_norm              | layer_norm_in_compute_dtype(x, w, b, eps)     | triton        | x (..., N, C)    |
| layer_norm_heads        | layer_norm_heads(x, w, b, eps, head_w, keep)  | triton        | x (B, I, J, C)   |
| adaptive_layer_norm     | modulation.adaptive_layer_norm(a, scale, ...) | triton        | a (rows, L, D)   |
| residual_adaptive_layer_norm | modulation.residual_adaptive_layer_norm | triton   | a (rows, L, D)   |
| swiglu_product          | modulation.swiglu_product(h)                  | triton        | h (rows, L, 3I)  |
| token_mean              | fast_score.token_mean(x, starts, ...)         | triton        | tokens of starts |
| outer_product_mean      | outer_product_mean_update(a, b, mask, ...)    | triton        | a (B, S, N, c)   |
| pair_weighted_average   | gated_pair_average(weights, values, gate)     | triton        | weights (B, H, N, N) |

cuEquivariance's fused `attention_pair_bias` is not routed: it also applies the input
LayerNorm and the q/k/v/g/o projections, a wider boundary than the core function (and the
diffusion transformer normalises with AdaLN instead).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from foldmill.kernels import (
    cueq,
    sdpa,
    triton_layer_norm,
    triton_modulation,
    triton_outer_product,
    triton_pair_average,
    triton_support,
    triton_transition,
    triton_triangle_attention,
    triton_triangle_multiplication,
)
from foldmill.kernels.registry import Backend, OpSpec, register_op

_CUDA = frozenset({"cuda"})
_CPU_AND_CUDA = frozenset({"cpu", "cuda"})
_HALF = frozenset({torch.bfloat16, torch.float16})
_FLOAT = frozenset({torch.bfloat16, torch.float16, torch.float32})


def _second_to_last_axis(x: torch.Tensor, *args: object, **kwargs: object) -> int:
    """Tokens of an op on (..., N, C) rows: the pair track (B, N, N, C), the single track (B, N, C)."""
    return x.shape[-2] if x.dim() >= 2 else 1


register_op(
    "triangle_multiplication",
    OpSpec(
        tokens=lambda x, *args, **kwargs: x.shape[-2],
        backends=(
            Backend("cueq", cueq.triangle_multiplicative_update, _CUDA, _HALF, cueq.available),
            Backend(
                "triton",
                triton_triangle_multiplication.triangle_multiplicative_update,
                _CUDA,
                _HALF,
                triton_support.available,
                triton_triangle_multiplication.supports_update,
            ),
        ),
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
                triton_triangle_attention.supports_triangle_attention,
            ),
        ),
    ),
)
register_op(
    "gated_triangle_attention",
    OpSpec(
        tokens=lambda q, *args, **kwargs: q.shape[-2],
        backends=(
            Backend(
                "triton",
                triton_triangle_attention.gated_triangle_attention,
                _CUDA,
                _HALF,
                triton_support.available,
                triton_triangle_attention.supports_gated_triangle_attention,
            ),
        ),
    ),
)
register_op(
    "attention_pair_bias",
    OpSpec(
        tokens=lambda q, k, *args, **kwargs: k.shape[1],
        backends=(
            Backend("sdpa", sdpa.attention_with_pair_bias, _CPU_AND_CUDA, _FLOAT),
            Backend(
                "triton", triton_triangle_attention.attention_with_pair_bias, _CUDA, _HALF, triton_support.available
            ),
        ),
    ),
)


def _register_triton_op(
    name: str,
    kernel: Callable[..., torch.Tensor],
    supports: Callable[..., bool],
    dtypes: frozenset,
    tokens: Callable[..., int] = _second_to_last_axis,
) -> None:
    """An op whose only backend besides the reference is one of foldmill's Triton kernels (CUDA)."""
    backend = Backend("triton", kernel, _CUDA, dtypes, triton_support.available, supports)
    register_op(name, OpSpec(tokens=tokens, backends=(backend,)))


_register_triton_op("transition", triton_transition.transition, triton_transition.supports_transition, _HALF)
_register_triton_op("layer_norm", triton_layer_norm.layer_norm, triton_layer_norm.supports_layer_norm, _HALF)
_register_triton_op(
    "layer_norm_heads", triton_layer_norm.layer_norm_heads, triton_layer_norm.supports_layer_norm_heads, _HALF
)
# The score model's elementwise ops (foldmill.fastpath.score): rows of (B * samples, L, D).
_register_triton_op(
    "adaptive_layer_norm",
    triton_modulation.adaptive_layer_norm,
    triton_modulation.supports_adaptive_layer_norm,
    _FLOAT,
)
_register_triton_op(
    "residual_adaptive_layer_norm",
    triton_modulation.residual_adaptive_layer_norm,
    triton_modulation.supports_residual_adaptive_layer_norm,
    _FLOAT,
)
_register_triton_op("swiglu_product", triton_modulation.swiglu_product, triton_modulation.supports_swiglu_product, _FLOAT)
_register_triton_op(
    "outer_product_mean", triton_outer_product.outer_product_mean_update, triton_outer_product.supports, _HALF
)
_register_triton_op(
    "pair_weighted_average", triton_pair_average.gated_pair_average, triton_pair_average.supports, _HALF
)
_register_triton_op(
    "token_mean",
    triton_modulation.token_mean,
    triton_modulation.supports_token_mean,
    _FLOAT,
    tokens=lambda x, starts, *args, **kwargs: starts.shape[-1] - 1,
)
