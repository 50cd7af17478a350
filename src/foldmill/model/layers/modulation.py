"""Elementwise pieces of the score model's conditioned transformer layers, as routed ops.

The diffusion transformer's layers (foldmill.model.diffusion_transformer) modulate a LayerNorm of
their residual stream by terms computed from the conditioning s (AdaLN) and gate a SwiGLU
product. foldmill.fastpath.score computes the s terms once per step (or once per sampling run,
for the atom transformers) and applies them here; both functions broadcast those terms over the
`samples` diffusion samples stacked record-major in the rows of `a`/`h`, so the terms are never
repeated per sample. Each is called through the kernel registry (a fused Triton kernel on CUDA,
foldmill.kernels.adaptive_layer_norm.triton).
"""

from __future__ import annotations

from torch import Tensor
from torch.nn import functional as F

from foldmill import kernels


def adaptive_layer_norm(a: Tensor, scale: Tensor, shift: Tensor, samples: int, eps: float) -> Tensor:
    """LN(a) * scale + shift, LN without affine parameters, in fp32; result in shift's dtype.

    a: (B * samples, L, D); scale (already through its sigmoid) and shift: (B, L, D), shared by a
    record's samples (any strides with a contiguous last axis).
    """
    rows, length, width = a.shape
    normed = F.layer_norm(a.float(), (width,), eps=eps).view(-1, samples, length, width)
    out = normed * scale.float()[:, None] + shift.float()[:, None]
    return out.view(rows, length, width).to(shift.dtype)


def residual_adaptive_layer_norm(
    a: Tensor, gate: Tensor, update: Tensor, scale: Tensor, shift: Tensor, samples: int, eps: float
) -> Tensor:
    """a += gate * update in place (the gated residual add that ends a sublayer), then
    adaptive_layer_norm(a, scale, shift) for the next one. gate: (B, L, D) like scale; update: a's shape."""
    gated_add_(a, gate, update, samples)
    return adaptive_layer_norm(a, scale, shift, samples, eps)


def gated_add_(a: Tensor, gate: Tensor, update: Tensor, samples: int) -> None:
    """a += gate * update in place, in fp32; a, update: (B*M, L, D); gate (B, L, D) shared by the M samples."""
    rows, length, width = a.shape
    shape = (-1, samples, length, width)
    a.view(shape).addcmul_(gate[:, None], update.view(shape))


def swiglu_product(h: Tensor) -> Tensor:
    """silu(gates) * x * y for h = [x | gates | y] on its last axis (three equal parts), in fp32;
    result in h's dtype. The conditioned transition's swish_gate (x | gates) and a_to_b (y)
    projections, made by one matrix product."""
    x, gates, y = h.float().chunk(3, dim=-1)
    return (F.silu(gates) * x * y).to(h.dtype)


def modulate(a: Tensor, scale: Tensor, shift: Tensor, samples: int, eps: float = 1e-5) -> Tensor:
    """The routed adaptive_layer_norm."""
    return kernels.dispatch("adaptive_layer_norm", a, scale, shift, samples, eps)


def residual_modulate(
    a: Tensor, gate: Tensor, update: Tensor, scale: Tensor, shift: Tensor, samples: int, eps: float = 1e-5
) -> Tensor:
    """The routed residual_adaptive_layer_norm (a is updated in place)."""
    return kernels.dispatch("residual_adaptive_layer_norm", a, gate, update, scale, shift, samples, eps)


def gated_product(h: Tensor) -> Tensor:
    """The routed swiglu_product."""
    return kernels.dispatch("swiglu_product", h)


# The plain PyTorch implementations the kernel registry runs where no backend applies.
kernels.register_reference("adaptive_layer_norm", adaptive_layer_norm)
kernels.register_reference("residual_adaptive_layer_norm", residual_adaptive_layer_norm)
kernels.register_reference("swiglu_product", swiglu_product)
