"""The "residual_adaptive_layer_norm" backend (Triton): the gated residual add that ends a diffusion
transformer sublayer and the next adaptive LayerNorm, in the adaptive LayerNorm's kernel
(foldmill.kernels.adaptive_layer_norm)."""

from __future__ import annotations

from torch import Tensor

from foldmill.kernels.adaptive_layer_norm.triton import kernel_applies


def supports(
    a: Tensor, gate: Tensor, update: Tensor, scale: Tensor, shift: Tensor, samples: int, eps: float
) -> bool:
    return kernel_applies(a, gate, scale, shift) and update.is_contiguous()


def residual_adaptive_layer_norm(
    a: Tensor, gate: Tensor, update: Tensor, scale: Tensor, shift: Tensor, samples: int, eps: float
) -> Tensor:
    from foldmill.kernels.adaptive_layer_norm.triton_kernel import adaptive_layer_norm as kernel

    return kernel(a, scale, shift, samples, eps, gate=gate, update=update)
