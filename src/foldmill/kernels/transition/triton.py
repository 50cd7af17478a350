"""Fused SwiGLU transition backend (Triton): LayerNorm + fc1/fc2 + SiLU gate + fc3 in one kernel.

Why: the reference writes LN(x), two (rows, hidden) projections, their gated product and the
output through HBM; on the pair track at N tokens that is N*N rows with hidden = 4*128, which
at 6,000 tokens is 73 GB for one hidden tensor alone. The kernel keeps each row block's hidden
activations on chip (foldmill.kernels.transition.triton_kernel), reading x once and writing the
output once, so memory stays at input + output and time at the matrix products.

Same arguments and result as foldmill.model.layers.transition.transition: the output is in the
compute dtype (the autocast dtype, else x's), which is what the reference returns under autocast.
`chunk_size` only bounds the reference's memory; the kernel always works in hidden slices. Triton is
imported lazily: this module loads where triton is absent (CPU CI); `triton_support.available()` is
then False. The reference math runs here instead for widths the kernel does not hold on chip (padded
wider than MAX_BLOCK_WIDTH, e.g. the score model's 768-wide conditioner) and when autograd records
(the kernel has no backward; inference runs under no_grad).
"""

from __future__ import annotations

from torch import Tensor

from foldmill.kernels.registry import compute_dtype
from foldmill.kernels.triton_support import MIN_WIDTH, padded_width, records_autograd

MAX_BLOCK_WIDTH = 512  # widest padded row one program keeps in registers (the single track's 384 pads to 512)


def supported(dim: int, out_dim: int) -> bool:
    """Whether the kernel holds rows of these widths on chip."""
    return min(dim, out_dim) >= MIN_WIDTH and max(padded_width(dim), padded_width(out_dim)) <= MAX_BLOCK_WIDTH


def supports(
    x: Tensor,
    norm_weight: Tensor,
    norm_bias: Tensor,
    fc1_weight: Tensor,
    fc2_weight: Tensor,
    fc3_weight: Tensor,
    eps: float = 1e-5,
    chunk_size: int | None = None,
) -> bool:
    autograd = records_autograd(x, norm_weight, norm_bias, fc1_weight, fc2_weight, fc3_weight)
    return not autograd and supported(x.shape[-1], fc3_weight.shape[0])


def transition(
    x: Tensor,
    norm_weight: Tensor,
    norm_bias: Tensor,
    fc1_weight: Tensor,
    fc2_weight: Tensor,
    fc3_weight: Tensor,
    eps: float = 1e-5,
    chunk_size: int | None = None,
) -> Tensor:
    """The registry backend (where `supports`)."""
    from foldmill.kernels.transition.triton_kernel import fused_transition

    return fused_transition(x, norm_weight, norm_bias, fc1_weight, fc2_weight, fc3_weight, eps, compute_dtype(x))
