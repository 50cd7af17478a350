"""NVIDIA cuEquivariance backends (`cuequivariance_torch` + its CUDA ops package), imported lazily.

`available()` is False (never an exception) where the ops package is missing, e.g. on CPU
machines that only carry cuequivariance-torch. The ops keep their own conventions: triangle
attention takes an fp32 bias (cast here); triangle multiplication reads fp32 weights and, under
bf16 autocast, runs its matrix products in bf16 with fp32 LayerNorms.
"""

from __future__ import annotations

import functools

from torch import Tensor


@functools.cache
def available() -> bool:
    try:
        import cuequivariance_ops_torch  # noqa: F401
        import cuequivariance_torch  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means "not here"
        return False
    return True


def triangle_multiplicative_update(
    x: Tensor,
    direction: str,
    mask: Tensor,
    norm_in_weight: Tensor,
    norm_in_bias: Tensor,
    p_in_weight: Tensor,
    g_in_weight: Tensor,
    norm_out_weight: Tensor,
    norm_out_bias: Tensor,
    p_out_weight: Tensor,
    g_out_weight: Tensor,
    eps: float = 1e-5,
    residual_out: Tensor | None = None,
) -> Tensor:
    from cuequivariance_torch import triangle_multiplicative_update as fused

    from foldmill.kernels.triton_triangle_multiplication import with_residual

    update = fused(
        x,
        direction=direction,
        mask=mask,
        norm_in_weight=norm_in_weight,
        norm_in_bias=norm_in_bias,
        p_in_weight=p_in_weight,
        g_in_weight=g_in_weight,
        norm_out_weight=norm_out_weight,
        norm_out_bias=norm_out_bias,
        p_out_weight=p_out_weight,
        g_out_weight=g_out_weight,
        eps=eps,
    )
    return with_residual(x, update, residual_out)


def triangle_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, mask: Tensor, scale: float) -> Tensor:
    from cuequivariance_torch import triangle_attention as fused

    return fused(q, k, v, bias.float(), mask=mask, scale=scale)
