"""LayerNorm backend (Triton) of the "layer_norm" op: fp32 statistics, output in the compute dtype.

Why: PyTorch's LayerNorm kernel runs one thread block per row; the pair track's rows are 128 wide
and there are N*N of them, so at 1,000 tokens one norm of the fp32 pair took 1.14 ms on the H200
(~0.9 TB/s) plus a 0.07 ms bf16 cast. The kernel normalises many rows per program, reads the input
once in its own dtype and writes the compute dtype once (768 MB of traffic at 1,000 tokens).
Strided inputs (the ending-node triangle attention normalises the transposed pair) are read in
place; the output is contiguous, as PyTorch's.

Measured on the H200 (fp32 pair in, bf16 out, 1,024 tokens, under autocast): 0.248 ms (3.2 TB/s)
against the reference's 1.763 ms; 0.239 ms on the transposed view. The shipped table has no rows for
this op, so the default order, Triton first, applies.

Triton is imported lazily (foldmill.kernels.layer_norm.triton_kernel): this module loads where
triton is absent; `triton_support.available()` is then False. Autograd recording and rows wider than
MAX_WIDTH run the reference.
"""

from __future__ import annotations

from torch import Tensor

from foldmill.kernels.registry import compute_dtype
from foldmill.kernels.triton_support import padded_width, records_autograd

MAX_WIDTH = 1024  # one padded row per register tile
HEAD_BLOCK = 16  # heads per projection tile (tl.dot's least width); fewer heads are masked


def row_layout(x: Tensor) -> tuple[Tensor, int, int, int]:
    """(x or a contiguous copy, inner, outer stride, inner stride): row r starts at
    (r // inner) * outer_stride + (r % inner) * inner_stride elements. Leading axes of size one are
    ignored; two leading axes with any strides, or more that merge into two, are read in place."""
    width = x.shape[-1]
    lead = [(size, stride) for size, stride in zip(x.shape[:-1], x.stride()[:-1]) if size != 1]
    merged: list[tuple[int, int]] = []
    for size, stride in lead:  # merge an axis into the previous one when they are contiguous together
        if merged and merged[-1][1] == size * stride:
            merged[-1] = (merged[-1][0] * size, stride)
        else:
            merged.append((size, stride))
    if x.stride(-1) != 1 or len(merged) > 2:
        x = x.contiguous()
        return x, 1, width, 0
    if len(merged) <= 1:
        return x, 1, merged[0][1] if merged else width, 0
    (_, outer_stride), (inner, inner_stride) = merged
    return x, inner, outer_stride, inner_stride


def supports(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float) -> bool:
    return not records_autograd(x, weight, bias) and padded_width(x.shape[-1]) <= MAX_WIDTH and x.numel() != 0


def layer_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor:
    """The registry backend (where `supports`)."""
    from foldmill.kernels.layer_norm.triton_kernel import fused_layer_norm

    return fused_layer_norm(x, weight, bias, eps, compute_dtype(x))
