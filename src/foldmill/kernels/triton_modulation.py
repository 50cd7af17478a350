"""Triton backends of the score model's elementwise ops ("adaptive_layer_norm", "swiglu_product")
and of its atoms-to-tokens mean (foldmill.fastpath.score).

Why: in the diffusion transformer each of these is a chain of 3-5 PyTorch kernels (LayerNorm,
multiply, add; silu, multiply, multiply; a dense one-hot product for the mean), run 200 steps x
30 layers per prediction; below ~1,000 tokens the step is bound by those launches and their extra
passes over the activations. One kernel each reads its inputs once and writes once. The token
mean also replaces a (B * samples, T, N) fp32 one-hot product (5.8 GB per step at 6,000 tokens)
by a sum over each token's contiguous atoms.

Triton is imported lazily (foldmill.kernels.triton_modulation_kernel): this module loads where
triton is absent; `triton_support.available()` is then False. Inputs the kernels do not take
(autograd recording, a non-contiguous activation, rows wider than MAX_WIDTH) run the reference
(the `supports_*` predicates).
"""

from __future__ import annotations

from torch import Tensor

from foldmill.kernels.triton_support import padded_width, records_autograd

MAX_WIDTH = 1024  # one padded row per register tile


def _kernel_applies(a: Tensor, *terms: Tensor) -> bool:
    """Contiguous activations, (B, L, D) terms with a contiguous last axis, rows that fit one tile."""
    terms_ok = all(term.dim() == 3 and term.stride(-1) == 1 for term in terms)
    return not records_autograd(a, *terms) and a.is_contiguous() and terms_ok and padded_width(a.shape[-1]) <= MAX_WIDTH


def supports_adaptive_layer_norm(a: Tensor, scale: Tensor, shift: Tensor, samples: int, eps: float) -> bool:
    return _kernel_applies(a, scale, shift)


def adaptive_layer_norm(a: Tensor, scale: Tensor, shift: Tensor, samples: int, eps: float) -> Tensor:
    from foldmill.kernels.triton_modulation_kernel import adaptive_layer_norm as kernel

    return kernel(a, scale, shift, samples, eps)


def supports_residual_adaptive_layer_norm(
    a: Tensor, gate: Tensor, update: Tensor, scale: Tensor, shift: Tensor, samples: int, eps: float
) -> bool:
    return _kernel_applies(a, gate, scale, shift) and update.is_contiguous()


def residual_adaptive_layer_norm(
    a: Tensor, gate: Tensor, update: Tensor, scale: Tensor, shift: Tensor, samples: int, eps: float
) -> Tensor:
    from foldmill.kernels.triton_modulation_kernel import adaptive_layer_norm as kernel

    return kernel(a, scale, shift, samples, eps, gate=gate, update=update)


def supports_swiglu_product(h: Tensor) -> bool:
    return not records_autograd(h) and h.is_contiguous() and h.shape[-1] % 3 == 0


def swiglu_product(h: Tensor) -> Tensor:
    from foldmill.kernels.triton_modulation_kernel import swiglu_product as kernel

    return kernel(h)


def supports_token_mean(x: Tensor, starts: Tensor, inverse_counts: Tensor, samples: int, max_atoms: int) -> bool:
    contiguous = x.is_contiguous() and starts.is_contiguous() and inverse_counts.is_contiguous()
    return not records_autograd(x) and contiguous


def token_mean(x: Tensor, starts: Tensor, inverse_counts: Tensor, samples: int, max_atoms: int) -> Tensor:
    from foldmill.kernels.triton_modulation_kernel import token_mean as kernel

    return kernel(x, starts, inverse_counts, samples, max_atoms)
