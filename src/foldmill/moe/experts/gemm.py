"""Grouped linear layers over tokens sorted by expert: the interface and the bf16 backends.

Shapes: activations x (rows, K) sorted by expert, expert e owning rows [ends[e-1], ends[e]);
weights w (experts, N, K) as in nn.Linear; `ends` int32 cumulative group ends. Rows past ends[-1]
are padding whose outputs nobody reads.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F


class ExpertGemm(Protocol):
    """One grouped linear layer y_e = x_e w_e^T, with its two backward GEMMs."""

    name: str
    # Expert groups are padded to a multiple of this many rows (the wgrad block size of 8-bit recipes).
    pad_multiple: int
    # Whether `forward` accepts its input already quantized (the fused SwiGLU can produce it).
    quantized_input: bool

    def forward(self, x: torch.Tensor, w: torch.Tensor, ends: torch.Tensor, x_quantized: object = None) -> torch.Tensor:
        """(rows, N): x_e w_e^T per group; `x_quantized` is x already in this backend's format, if any."""

    def dgrad(self, dy: torch.Tensor, w: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
        """(rows, K): dy_e w_e per group."""

    def wgrad(self, dy: torch.Tensor, x: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
        """(experts, N, K): dy_e^T x_e per group."""


def group_bounds(ends: torch.Tensor) -> list[tuple[int, int]]:
    """[(start, end)] per expert (synchronizes with the device: used by the loop backend only)."""
    stops = [int(v) for v in ends.tolist()]
    return list(zip([0, *stops[:-1]], stops))


class LoopGemm:
    """One matmul per expert in a Python loop: what Hugging Face's eager Mixtral does."""

    name = "loop"
    pad_multiple = 1
    quantized_input = False

    def forward(self, x, w, ends, x_quantized=None):
        out = x.new_zeros(x.shape[0], w.shape[1])
        for expert, (start, stop) in enumerate(group_bounds(ends)):
            if stop > start:
                out[start:stop] = x[start:stop] @ w[expert].t()
        return out

    def dgrad(self, dy, w, ends):
        out = dy.new_zeros(dy.shape[0], w.shape[2])
        for expert, (start, stop) in enumerate(group_bounds(ends)):
            if stop > start:
                out[start:stop] = dy[start:stop] @ w[expert]
        return out

    def wgrad(self, dy, x, ends):
        out = dy.new_zeros(ends.shape[0], dy.shape[1], x.shape[1])
        for expert, (start, stop) in enumerate(group_bounds(ends)):
            if stop > start:
                out[expert] = dy[start:stop].t() @ x[start:stop]
        return out


class GroupedGemm:
    """bf16 grouped GEMM (`torch.nn.functional.grouped_mm`): one launch for all experts, no host sync."""

    name = "grouped"
    pad_multiple = 1
    quantized_input = False

    def forward(self, x, w, ends, x_quantized=None):
        return F.grouped_mm(x, w.transpose(-2, -1), offs=ends)

    def dgrad(self, dy, w, ends):
        return F.grouped_mm(dy, w, offs=ends)

    def wgrad(self, dy, x, ends):
        return F.grouped_mm(dy.t(), x, offs=ends)
