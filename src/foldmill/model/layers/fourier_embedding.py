"""Random Fourier features of a scalar, AF3 Algorithm 22: t (B,) -> cos(2 pi (w t + b)) (B, dim).

Used for contact-conditioning distance cutoffs and for the diffusion noise level. The
projection `proj` (Linear(1, dim)) is fixed after initialisation and stored in the checkpoint.
"""

from __future__ import annotations

import math

from torch import Tensor, nn


class FourierEmbedding(nn.Module):
    """Fixed random frequencies and phases."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(1, dim)
        nn.init.normal_(self.proj.weight)  # unit-variance frequencies and phases, as in AF3
        nn.init.normal_(self.proj.bias)
        self.proj.requires_grad_(False)

    def forward(self, times: Tensor) -> Tensor:
        """times: (B,) -> (B, dim)."""
        return (2 * math.pi * self.proj(times[:, None])).cos()
