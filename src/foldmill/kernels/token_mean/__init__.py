"""The "token_mean" op of the score model: the mean of each token's atoms (reference:
foldmill.fastpath.score.token_mean). Backend: Triton (triton.py, triton_kernel.py). Tokens: those of
`starts` (one more entry than tokens)."""

from __future__ import annotations

from foldmill.kernels import triton_support
from foldmill.kernels.registry import (
    CUDA,
    FLOAT,
    Backend,
    OpSpec,
    half_precision_order,
    register_op,
)
from foldmill.kernels.token_mean import triton

register_op(
    "token_mean",
    OpSpec(
        tokens=lambda x, starts, *args, **kwargs: starts.shape[-1] - 1,
        backends=(Backend("triton", triton.token_mean, CUDA, FLOAT, triton_support.available, triton.supports),),
        default_order=half_precision_order("triton"),
    ),
)
