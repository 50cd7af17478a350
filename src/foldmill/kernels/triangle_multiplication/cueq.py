"""The "triangle_multiplication" backend on cuEquivariance's fused op (imported lazily;
foldmill.kernels.cueq says whether it is installed). It reads fp32 weights and, under bf16 autocast, runs
its matrix products in bf16 with fp32 LayerNorms."""

from __future__ import annotations

from torch import Tensor

from foldmill.kernels.triangle_multiplication.weights import TriangleMultiplicationWeights, with_residual


def triangle_multiplication(
    x: Tensor,
    direction: str,
    mask: Tensor,
    weights: TriangleMultiplicationWeights,
    residual_out: Tensor | None = None,
) -> Tensor:
    from cuequivariance_torch import triangle_multiplicative_update as fused

    update = fused(
        x,
        direction=direction,
        mask=mask,
        norm_in_weight=weights.norm_in_weight,
        norm_in_bias=weights.norm_in_bias,
        p_in_weight=weights.p_in_weight,
        g_in_weight=weights.g_in_weight,
        norm_out_weight=weights.norm_out_weight,
        norm_out_bias=weights.norm_out_bias,
        p_out_weight=weights.p_out_weight,
        g_out_weight=weights.g_out_weight,
        eps=weights.eps,
    )
    return with_residual(x, update, residual_out)
