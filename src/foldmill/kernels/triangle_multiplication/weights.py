"""What every triangle multiplication implementation takes besides the pair: its weights, and how it adds
the update to the pair."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class TriangleMultiplicationWeights:
    """A triangle multiplication's parameters, in the Boltz-2 module's order (norm_in, p_in, g_in,
    norm_out, p_out, g_out), and its LayerNorms' eps."""

    norm_in_weight: Tensor
    norm_in_bias: Tensor
    p_in_weight: Tensor
    g_in_weight: Tensor
    norm_out_weight: Tensor
    norm_out_bias: Tensor
    p_out_weight: Tensor
    g_out_weight: Tensor
    eps: float = 1e-5

    def tensors(self) -> tuple[Tensor, ...]:
        """The eight tensors, in field order."""
        return tuple(getattr(self, name) for name in _TENSORS)


_TENSORS = (
    "norm_in_weight", "norm_in_bias", "p_in_weight", "g_in_weight",
    "norm_out_weight", "norm_out_bias", "p_out_weight", "g_out_weight",
)  # fmt: skip


def with_residual(x: Tensor, update: Tensor, residual_out: Tensor | None) -> Tensor:
    """The update as is, or x + update written into `residual_out` (x itself, or a tensor like x): the
    result of every triangle multiplication backend. In-place adds, not `out=`, so autograd records it."""
    if residual_out is None:
        return update
    if residual_out is not x:
        residual_out.copy_(x)
    return residual_out.add_(update)
