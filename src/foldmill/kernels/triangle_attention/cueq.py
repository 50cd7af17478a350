"""The "triangle_attention" backend on cuEquivariance's fused op (imported lazily; foldmill.kernels.cueq
says whether it is installed). It takes an fp32 bias (cast here)."""

from __future__ import annotations

from torch import Tensor


def triangle_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, mask: Tensor, scale: float) -> Tensor:
    from cuequivariance_torch import triangle_attention as fused

    return fused(q, k, v, bias.float(), mask=mask, scale=scale)
