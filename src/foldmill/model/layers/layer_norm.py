"""LayerNorm with fp32 statistics whose output has the compute dtype (the "layer_norm" routed op).

Under bf16 autocast a plain LayerNorm reads the fp32 residual stream, computes in fp32 and returns
fp32, which the next projection converts to bf16 again: one more pass over the pair per norm.
This op returns the compute dtype directly (autocast's where it is on, else the input's).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

from foldmill.kernels.registry import compute_dtype


def layer_norm_in_compute_dtype(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor:
    """LayerNorm over the last axis, fp32 statistics, result in the compute dtype.

    An input already in the compute dtype is normalised by CUDA's kernel in that dtype (it
    accumulates in fp32; `weight`/`bias` are cast to x's dtype where they differ: callers on a hot
    path pass them cast once), otherwise in fp32 and rounded once.
    """
    out_dtype = compute_dtype(x)
    with torch.autocast(x.device.type, enabled=False):
        if x.dtype == out_dtype:
            weight, bias = (None if p is None else p.to(x.dtype) for p in (weight, bias))
            return F.layer_norm(x, x.shape[-1:], weight, bias, eps)
        return F.layer_norm(x.float(), x.shape[-1:], weight, bias, eps).to(out_dtype)
