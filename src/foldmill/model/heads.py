"""Trunk output heads.

DistogramModule: z (B, N, N, token_z) -> logits (B, N, N, num_distograms, num_bins) over
token-pair distance bins (symmetrised: computed from z + z^T).
BFactorModule: s (B, N, token_s) -> logits (B, N, num_bins) over per-token B-factor bins.
Parameter names (distogram, bfactor) match the Boltz-2 checkpoint.
"""

from __future__ import annotations

from torch import Tensor, nn


class DistogramModule(nn.Module):
    """Pairwise distance-bin logits."""

    def __init__(self, token_z: int, num_bins: int, num_distograms: int = 1) -> None:
        super().__init__()
        self.num_bins = num_bins
        self.num_distograms = num_distograms
        self.distogram = nn.Linear(token_z, num_distograms * num_bins)

    def forward(self, z: Tensor) -> Tensor:
        z = z + z.transpose(1, 2)
        return self.distogram(z).reshape(*z.shape[:3], self.num_distograms, self.num_bins)


class BFactorModule(nn.Module):
    """Per-token B-factor-bin logits."""

    def __init__(self, token_s: int, num_bins: int) -> None:
        super().__init__()
        self.num_bins = num_bins
        self.bfactor = nn.Linear(token_s, num_bins)

    def forward(self, s: Tensor) -> Tensor:
        return self.bfactor(s)
