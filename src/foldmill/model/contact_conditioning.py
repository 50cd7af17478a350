"""Pocket / contact constraint conditioning of the pair representation.

feats["contact_conditioning"] (B, N, N, 5) one-hot over vocab.CONTACT_CONDITIONING and
feats["contact_threshold"] (B, N, N) distance cutoff in Angstrom -> (B, N, N, token_z).
Constrained pairs get a learned encoding of (constraint type, cutoff normalised to
[cutoff_min, cutoff_max], Fourier features of that cutoff); pairs of the two "no
constraint" classes get one learned vector each. Parameters (fourier_embedding, encoder,
encoding_unspecified, encoding_unselected) match the Boltz-2 checkpoint.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from foldmill.model.layers.fourier_embedding import FourierEmbedding
from foldmill.vocab import CONTACT_CONDITIONING

# Classes UNSPECIFIED (0) and UNSELECTED (1) mean "no constraint"; the constraint types follow.
_UNSPECIFIED = CONTACT_CONDITIONING["UNSPECIFIED"]
_UNSELECTED = CONTACT_CONDITIONING["UNSELECTED"]
_NO_CONSTRAINT = slice(0, 2)
_CONSTRAINT = slice(2, None)


class ContactConditioning(nn.Module):
    """Embeds user-given pocket and contact constraints into pair features."""

    def __init__(self, token_z: int, cutoff_min: float, cutoff_max: float) -> None:
        super().__init__()
        self.cutoff_min = cutoff_min
        self.cutoff_max = cutoff_max
        self.fourier_embedding = FourierEmbedding(token_z)
        constraint_types = len(CONTACT_CONDITIONING) - _NO_CONSTRAINT.stop
        # + 1 for the normalised cutoff itself
        self.encoder = nn.Linear(token_z + constraint_types + 1, token_z)
        self.encoding_unspecified = nn.Parameter(torch.zeros(token_z))
        self.encoding_unselected = nn.Parameter(torch.zeros(token_z))

    def forward(self, feats: dict[str, Tensor], rows: slice = slice(None)) -> Tensor:
        """(B, rows, N, token_z) for the token rows `rows` (all by default)."""
        classes = feats["contact_conditioning"][:, rows]
        cutoff = (feats["contact_threshold"][:, rows] - self.cutoff_min) / (self.cutoff_max - self.cutoff_min)
        cutoff_fourier = self.fourier_embedding(cutoff.flatten()).reshape(*cutoff.shape, -1)
        encoded = self.encoder(torch.cat([classes[..., _CONSTRAINT], cutoff.unsqueeze(-1), cutoff_fourier], dim=-1))
        no_constraint = classes[..., _NO_CONSTRAINT]
        return (
            encoded * (1 - no_constraint.sum(dim=-1, keepdim=True))
            + self.encoding_unspecified * classes[..., _UNSPECIFIED : _UNSPECIFIED + 1]
            + self.encoding_unselected * classes[..., _UNSELECTED : _UNSELECTED + 1]
        )
