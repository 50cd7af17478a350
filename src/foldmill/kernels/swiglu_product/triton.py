"""The "swiglu_product" backend (Triton): silu(gates) * x * y in one pass (foldmill.kernels.swiglu_product.triton_kernel)."""

from __future__ import annotations

from torch import Tensor

from foldmill.kernels.triton_support import records_autograd


def supports(h: Tensor) -> bool:
    return not records_autograd(h) and h.is_contiguous() and h.shape[-1] % 3 == 0


def swiglu_product(h: Tensor) -> Tensor:
    from foldmill.kernels.swiglu_product.triton_kernel import swiglu_product as kernel

    return kernel(h)
