"""Pair-weighted-averaging backend (Triton): the weighted average of the MSA values and its gate in one
kernel (foldmill.kernels.pair_weighted_average.triton_kernel), reading the values and the gate in place.

Why: the reference (foldmill.model.layers.pair_weighted_average.pair_weighted_average) is an einsum
that copies the (B, S, N, H * D) values into a (head, token, row) layout and its result back, then
multiplies by the gate in a further pass: three extra round trips of an MSA-sized tensor.
Measured on the H200 with 2,048 MSA rows (the whole layer by head): 16.5 ms against the
reference's 20.7 at 849 tokens, but 40.1 against 34.6 at 1,672 and 75.1 against 60.3 at 2,472 (its
strided value loads, 64 bytes per token and MSA row, lose to cuBLAS on the reference's copied
layout), so the crossover table runs it up to 1,191 tokens only.
Same arguments and result as the reference; the reference runs instead for head widths the kernel
does not tile (other than 16 and 32) and when autograd records.
"""

from __future__ import annotations

from torch import Tensor

from foldmill.kernels.registry import compute_dtype
from foldmill.kernels.triton_support import records_autograd

KERNEL_HEAD_WIDTHS = (16, 32)


def supports(weights: Tensor, values: Tensor, gate: Tensor) -> bool:
    """Head widths the kernel tiles, outside autograd."""
    head_width = values.shape[-1] // weights.shape[1]
    return not records_autograd(weights, values, gate) and head_width in KERNEL_HEAD_WIDTHS


def pair_weighted_average(weights: Tensor, values: Tensor, gate: Tensor) -> Tensor:
    """The registry backend (where `supports`)."""
    from foldmill.kernels.pair_weighted_average.triton_kernel import pair_weighted_average as kernel

    return kernel(weights, values, gate, compute_dtype(values))
