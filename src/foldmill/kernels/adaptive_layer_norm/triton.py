"""Triton backends of the score model's elementwise ops ("adaptive_layer_norm", "swiglu_product")
and of its atoms-to-tokens mean (foldmill.fastpath.score).

Why: in the diffusion transformer each of these is a chain of 3-5 PyTorch kernels (LayerNorm,
multiply, add; silu, multiply, multiply; a dense one-hot product for the mean), run 200 steps x
30 layers per prediction; below ~1,000 tokens the step is bound by those launches and their extra
passes over the activations. One kernel each reads its inputs once and writes once. The token
mean also replaces a (B * samples, T, N) fp32 one-hot product (5.8 GB per step at 6,000 tokens)
by a sum over each token's contiguous atoms.

Triton is imported lazily (foldmill.kernels.adaptive_layer_norm.triton_kernel): this module loads where
triton is absent; `triton_support.available()` is then False. Inputs the kernels do not take
(autograd recording, a non-contiguous activation, rows wider than MAX_WIDTH) run the reference
(the `supports_*` predicates).
"""

from __future__ import annotations

from torch import Tensor

from foldmill.kernels.triton_support import padded_width, records_autograd

MAX_WIDTH = 1024  # one padded row per register tile


def kernel_applies(a: Tensor, *terms: Tensor) -> bool:
    """Contiguous activations, (B, L, D) terms with a contiguous last axis, rows that fit one tile."""
    terms_ok = all(term.dim() == 3 and term.stride(-1) == 1 for term in terms)
    return not records_autograd(a, *terms) and a.is_contiguous() and terms_ok and padded_width(a.shape[-1]) <= MAX_WIDTH


def supports(a: Tensor, scale: Tensor, shift: Tensor, samples: int, eps: float) -> bool:
    return kernel_applies(a, scale, shift)


def adaptive_layer_norm(a: Tensor, scale: Tensor, shift: Tensor, samples: int, eps: float) -> Tensor:
    from foldmill.kernels.adaptive_layer_norm.triton_kernel import adaptive_layer_norm as kernel

    return kernel(a, scale, shift, samples, eps)
