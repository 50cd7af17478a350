"""Outer product mean: MSA (B, S, N, c_in) + MSA mask (B, S, N) -> pair update (B, N, N, c_out).

For every token pair (i, j), average over the unmasked MSA rows of the outer product of
two low-rank projections a_si (x) b_sj, flatten (c_hidden^2) and project to c_out.
Parameter names (norm, proj_a, proj_b, proj_o) match the Boltz-2 checkpoint.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from foldmill.model.token_rows import by_token_rows


class OuterProductMean(nn.Module):
    """AF3 Algorithm 9 (MSA -> pair communication)."""

    def __init__(self, c_in: int, c_hidden: int, c_out: int) -> None:
        super().__init__()
        self.c_hidden = c_hidden
        self.norm = nn.LayerNorm(c_in)
        self.proj_a = nn.Linear(c_in, c_hidden, bias=False)
        self.proj_b = nn.Linear(c_in, c_hidden, bias=False)
        self.proj_o = nn.Linear(c_hidden * c_hidden, c_out)

    def forward(self, m: Tensor, mask: Tensor, token_rows: int | None = None) -> Tensor:
        """m: (B, S, N, c_in), mask: (B, S, N). token_rows computes the pair update `token_rows` rows i
        at a time, which bounds the (rows, N, c_hidden^2) outer product at any N (rows are independent:
        the same values; Boltz-2 bounds it by chunks of a's channels instead, which changes only the
        summation order of the output projection)."""
        mask = mask.unsqueeze(-1).to(m)
        m = self.norm(m)
        a = self.proj_a(m) * mask
        b = self.proj_b(m) * mask
        tokens = m.shape[2]
        return by_token_rows(
            lambda rows: self._project(a[:, :, rows], b, mask[:, :, rows], mask), tokens, token_rows or tokens
        )

    def _project(self, a: Tensor, b: Tensor, mask_a: Tensor, mask_b: Tensor) -> Tensor:
        """The unchunked computation for the token rows of `a` (B, S, I, c) against all of `b` (B, S, N, c)."""
        row_count = (mask_a[:, :, :, None] * mask_b[:, :, None, :]).sum(1).clamp(min=1)
        outer = torch.einsum("bsic,bsjd->bijcd", a.float(), b.float())
        return self.proj_o((outer.reshape(*outer.shape[:3], -1) / row_count).to(a))
