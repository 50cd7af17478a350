"""SwiGLU transition: LayerNorm, then fc3(silu(fc1(x)) * fc2(x)).

Input x (..., dim) -> output (..., out_dim). Used on the single track (s), the pair
track (z) and the MSA track (m). Parameters: norm, fc1, fc2, fc3 (bias-free linears),
named as in the Boltz-2 checkpoint.

The whole op is the plain function `transition`, called through the kernel registry
(foldmill.kernels), which may run a fused Triton kernel instead (foldmill.kernels.transition.triton):
on the pair track the reference materialises two (N*N, 4*128) hidden tensors per block.
"""

from __future__ import annotations

from torch import Tensor, nn
from torch.nn import functional as F

from foldmill import kernels
from foldmill.model.layers.layer_norm import LayerNorm


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
    """Reference: fc3(silu(fc1(LN(x))) * fc2(LN(x))); chunk_size splits the hidden width to bound peak memory."""
    x = F.layer_norm(x, (x.shape[-1],), norm_weight, norm_bias, eps)
    if chunk_size is None:
        return F.linear(F.silu(F.linear(x, fc1_weight)) * F.linear(x, fc2_weight), fc3_weight)
    # Same sum, accumulated over slices of the hidden units.
    out = None
    for start in range(0, fc1_weight.shape[0], chunk_size):
        hidden_slice = slice(start, start + chunk_size)
        gated = F.silu(x @ fc1_weight[hidden_slice].T) * (x @ fc2_weight[hidden_slice].T)
        part = gated @ fc3_weight[:, hidden_slice].T
        out = part if out is None else out + part
    return out


class Transition(nn.Module):
    """Two-layer gated MLP with a pre-LayerNorm."""

    def __init__(self, dim: int = 128, hidden: int = 512, out_dim: int | None = None) -> None:
        super().__init__()
        out_dim = dim if out_dim is None else out_dim
        self.hidden = hidden
        self.norm = LayerNorm(dim, eps=1e-5)
        self.fc1 = nn.Linear(dim, hidden, bias=False)
        self.fc2 = nn.Linear(dim, hidden, bias=False)
        self.fc3 = nn.Linear(hidden, out_dim, bias=False)

    def forward(self, x: Tensor, chunk_size: int | None = None) -> Tensor:
        """x: (..., dim). chunk_size splits the hidden width to bound peak memory (reference path)."""
        return kernels.dispatch(
            "transition",
            x,
            self.norm.weight,
            self.norm.bias,
            self.fc1.weight,
            self.fc2.weight,
            self.fc3.weight,
            eps=self.norm.eps,
            chunk_size=chunk_size,
        )


# The plain PyTorch implementations the kernel registry runs where no backend applies.
kernels.register_reference("transition", transition)
