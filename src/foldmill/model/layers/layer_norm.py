"""LayerNorm with fp32 statistics whose output has the compute dtype (the "layer_norm" routed op).

Under bf16 autocast a plain LayerNorm reads the fp32 residual stream, computes in fp32 and returns
fp32, which the next projection converts to bf16 again: one more pass over the pair per norm.
This op returns the compute dtype directly (autocast's where it is on, else the input's).
The model's norms are `LayerNorm`: nn.LayerNorm (same parameters, same result) unless an inference
copy sets its `in_compute_dtype` hook (foldmill.fastpath does), which routes it through this op.
`normed_and_heads` is a pair's LayerNorm with an attention's bias projection (the "layer_norm_heads"
op where the norm computes in the compute dtype).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from foldmill import kernels
from foldmill.kernels.registry import compute_dtype


def layer_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor:
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


def layer_norm_heads(
    x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, head_weight: Tensor, keep_normed: bool
) -> tuple[Tensor | None, Tensor]:
    """(layer_norm(x), or None without keep_normed; its projection by head_weight (H, C)
    heads first: (B, H, I, J), contiguous) for a pair x (B, I, J, C)."""
    normed = layer_norm(x, weight, bias, eps)
    heads = F.linear(normed, head_weight).permute(0, 3, 1, 2).contiguous()
    return (normed if keep_normed else None), heads


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm, with a hook for inference copies: with `in_compute_dtype` set, the statistics are fp32
    and the output has the compute dtype (the routed "layer_norm" op; a Triton kernel on CUDA), and
    `with_heads` makes the norm and an attention's bias projection in one op. The parameters stay fp32;
    for a half-precision input the reference wants half copies of them (CUDA's kernel takes one dtype and
    accumulates in fp32 anyway), made once: an inference copy's weights do not change."""

    in_compute_dtype = False  # set per instance

    def _parameters_in(self, dtype: torch.dtype) -> tuple[Tensor | None, Tensor | None]:
        cache = self.__dict__.setdefault("_cast_parameters", {})
        key = (dtype, None if self.weight is None else self.weight.device)
        if key not in cache:
            cache[key] = tuple(None if p is None else p.detach().to(dtype) for p in (self.weight, self.bias))
        return cache[key]

    def _parameters_for(self, x: Tensor) -> tuple[Tensor | None, Tensor | None]:
        return self._parameters_in(x.dtype) if x.dtype == compute_dtype(x) else (self.weight, self.bias)

    def forward(self, x: Tensor) -> Tensor:
        if not self.in_compute_dtype:
            return super().forward(x)
        return kernels.dispatch("layer_norm", x, *self._parameters_for(x), self.eps)

    def with_heads(self, x: Tensor, head_weight: Tensor, keep_normed: bool = True) -> tuple[Tensor | None, Tensor]:
        """This norm (in the compute dtype) of x and its projection by head_weight heads first, in one op."""
        weight, bias = self._parameters_for(x)
        return kernels.dispatch("layer_norm_heads", x, weight, bias, self.eps, head_weight, keep_normed)


def normed_and_heads(
    norm: nn.Module, projection: nn.Linear, x: Tensor, keep_normed: bool = True
) -> tuple[Tensor | None, Tensor]:
    """(norm(x), or None without keep_normed; projection(norm(x)) heads first, (B, H, I, J) contiguous) for a
    pair x (B, I, J, C): an attention's LayerNorm and pair-bias projection. A LayerNorm computing in the
    compute dtype makes both in one op; any other norm runs the two modules."""
    if getattr(norm, "in_compute_dtype", False) and projection.bias is None:
        return norm.with_heads(x, projection.weight, keep_normed)
    normed = norm(x)
    return (normed if keep_normed else None), projection(normed).permute(0, 3, 1, 2).contiguous()


# The plain PyTorch implementations the kernel registry runs where no backend applies.
kernels.register_reference("layer_norm", layer_norm)
kernels.register_reference("layer_norm_heads", layer_norm_heads)
