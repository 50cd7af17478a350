"""The "token_mean" backend (Triton): the score model's atoms-to-tokens mean as a sum over each token's
contiguous atoms (foldmill.kernels.token_mean.triton_kernel), in place of a (B * samples, T, N) fp32 one-hot
product (5.8 GB per step at 6,000 tokens)."""

from __future__ import annotations

from torch import Tensor

from foldmill.kernels.triton_support import records_autograd


def supports(x: Tensor, starts: Tensor, inverse_counts: Tensor, samples: int, max_atoms: int) -> bool:
    contiguous = x.is_contiguous() and starts.is_contiguous() and inverse_counts.is_contiguous()
    return not records_autograd(x) and contiguous


def token_mean(x: Tensor, starts: Tensor, inverse_counts: Tensor, samples: int, max_atoms: int) -> Tensor:
    from foldmill.kernels.token_mean.triton_kernel import token_mean as kernel

    return kernel(x, starts, inverse_counts, samples, max_atoms)
