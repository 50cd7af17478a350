"""Outer product mean: MSA (B, S, N, c_in) + MSA mask (B, S, N) -> pair update (B, N, N, c_out).

For every token pair (i, j), average over the unmasked MSA rows of the outer product of
two low-rank projections a_si (x) b_sj, flatten (c_hidden^2) and project to c_out.
Parameter names (norm, proj_a, proj_b, proj_o) match the Boltz-2 checkpoint.

`outer_product_mean` (the part after the projections a and b) is the reference of the
"outer_product_mean" op of foldmill.kernels, which a fused kernel replaces on the GPU.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from foldmill import kernels
from foldmill.kernels.token_rows import by_token_rows
from foldmill.model.layers.layer_norm import LayerNorm


def outer_product_mean(
    a: Tensor, b: Tensor, mask: Tensor, weight: Tensor, bias: Tensor | None, token_rows: int | None = None
) -> Tensor:
    """a, b: (B, S, N, c) masked projections, mask: (B, S, N) -> (B, N, N, c_out) =
    (mean over the rows s unmasked at both i and j of a_si (x) b_sj, flattened) W^T + bias.

    token_rows computes `token_rows` rows i at a time, which bounds the (rows, N, c^2) outer product
    at any N (rows are independent: the same values; Boltz-2 bounds it by chunks of a's channels
    instead, which changes only the summation order of the output projection)."""
    mask = mask.unsqueeze(-1).to(a)

    def project(rows: slice) -> Tensor:
        row_count = (mask[:, :, rows, None] * mask[:, :, None, :]).sum(1).clamp(min=1)
        outer = torch.einsum("bsic,bsjd->bijcd", a[:, :, rows].float(), b.float())
        return F.linear((outer.reshape(*outer.shape[:3], -1) / row_count).to(a), weight, bias)

    tokens = a.shape[2]
    return by_token_rows(project, tokens, token_rows or tokens)


class OuterProductMean(nn.Module):
    """AF3 Algorithm 9 (MSA -> pair communication)."""

    def __init__(self, c_in: int, c_hidden: int, c_out: int) -> None:
        super().__init__()
        self.c_hidden = c_hidden
        self.norm = LayerNorm(c_in)
        self.proj_a = nn.Linear(c_in, c_hidden, bias=False)
        self.proj_b = nn.Linear(c_in, c_hidden, bias=False)
        self.proj_o = nn.Linear(c_hidden * c_hidden, c_out)

    def forward(self, m: Tensor, mask: Tensor, token_rows: int | None = None) -> Tensor:
        """m: (B, S, N, c_in), mask: (B, S, N); token_rows: see outer_product_mean."""
        valid = mask.unsqueeze(-1).to(m)
        m = self.norm(m)
        a = self.proj_a(m) * valid
        b = self.proj_b(m) * valid
        return kernels.dispatch(
            "outer_product_mean", a, b, mask, self.proj_o.weight, self.proj_o.bias, token_rows
        )


# The plain PyTorch implementations the kernel registry runs where no backend applies.
kernels.register_reference("outer_product_mean", outer_product_mean)
