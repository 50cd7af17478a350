"""SwiGLU transition: LayerNorm, then fc3(silu(fc1(x)) * fc2(x)).

Input x (..., dim) -> output (..., out_dim). Used on the single track (s), the pair
track (z) and the MSA track (m). Parameters: norm, fc1, fc2, fc3 (bias-free linears),
named as in the Boltz-2 checkpoint.
"""

from __future__ import annotations

from torch import Tensor, nn


class Transition(nn.Module):
    """Two-layer gated MLP with a pre-LayerNorm."""

    def __init__(self, dim: int = 128, hidden: int = 512, out_dim: int | None = None) -> None:
        super().__init__()
        out_dim = dim if out_dim is None else out_dim
        self.hidden = hidden
        self.norm = nn.LayerNorm(dim, eps=1e-5)
        self.fc1 = nn.Linear(dim, hidden, bias=False)
        self.fc2 = nn.Linear(dim, hidden, bias=False)
        self.fc3 = nn.Linear(hidden, out_dim, bias=False)

    def forward(self, x: Tensor, chunk_size: int | None = None) -> Tensor:
        """x: (..., dim). chunk_size splits the hidden width to bound peak memory."""
        x = self.norm(x)
        if chunk_size is None:
            return self.fc3(nn.functional.silu(self.fc1(x)) * self.fc2(x))
        # Same sum, accumulated over slices of the hidden units.
        out = None
        for start in range(0, self.hidden, chunk_size):
            hidden_slice = slice(start, start + chunk_size)
            gated = nn.functional.silu(x @ self.fc1.weight[hidden_slice].T) * (x @ self.fc2.weight[hidden_slice].T)
            part = gated @ self.fc3.weight[:, hidden_slice].T
            out = part if out is None else out + part
        return out
