"""Triangle multiplication backend (Triton + cuBLAS): the gated edges and the gated output in one kernel each,
the edge product as one batched matrix product over channels (foldmill.kernels.triangle_multiplication.triton_kernel).

Why: the reference writes LayerNorm outputs, (N, N, 4C) projections, permuted copies for the product and
its output through HBM. Here x is read twice and a, b and the product are written once each, in the
compute dtype, channel-major (the product's layout), so no permuting copy is made. With `residual_out`
the output kernel also adds the update to x (the trunk's residual add), which saves a pass over the fp32
pair.

Same arguments and result as the reference (foldmill.model.layers.triangle_multiplication):
the update in the compute dtype (the autocast dtype, else x's), or x + update in `residual_out`. The
reference runs instead in fp32 compute (the registry sends only half precision here), when autograd
records (the kernels have no backward pass) and for channel counts the kernels do not tile (not a power
of two from 16 to 128; Boltz-2's are 128 and 64). Triton is imported
lazily: this module loads where triton is absent (CPU CI).
"""

from __future__ import annotations

import torch
from torch import Tensor

from foldmill.kernels.registry import compute_dtype
from foldmill.kernels.triangle_multiplication.weights import TriangleMultiplicationWeights
from foldmill.kernels.triton_support import MIN_WIDTH, padded_width, records_autograd

MAX_CHANNELS = 128  # widest pair one program holds: a (pairs, C) fp32 tile per operand


def supported(channels: int) -> bool:
    """Whether the kernels tile pairs of this many channels."""
    return MIN_WIDTH <= channels <= MAX_CHANNELS and padded_width(channels) == channels


def supports(
    x: Tensor,
    direction: str,
    mask: Tensor,
    weights: TriangleMultiplicationWeights,
    residual_out: Tensor | None = None,
) -> bool:
    """Half-precision compute (fp32 compute is the reference's), a contiguous `residual_out`, channel
    counts the kernels tile, outside autograd."""
    unfit = residual_out is not None and residual_out.stride(-1) != 1
    return not (
        unfit
        or compute_dtype(x) == torch.float32
        or records_autograd(x, *weights.tensors())
        or not supported(x.shape[-1])
    )


def triangle_multiplication(
    x: Tensor,
    direction: str,
    mask: Tensor,
    weights: TriangleMultiplicationWeights,
    residual_out: Tensor | None = None,
) -> Tensor:
    """The registry backend (where `supports`)."""
    from foldmill.kernels.triangle_multiplication.triton_kernel import fused_update

    return fused_update(x, direction, mask, weights.tensors(), weights.eps, compute_dtype(x), residual_out)
