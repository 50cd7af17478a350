"""Grouped linear layers over tokens sorted by expert: the interface and the bf16 backends.

Shapes: activations x (rows, K) sorted by expert, expert e owning rows [ends[e-1], ends[e]);
weights w (experts, N, K) as in nn.Linear; `ends` int32 cumulative group ends. Rows past ends[-1]
are padding whose outputs nobody reads.

A backend runs one grouped linear layer forward, and its backward as the pair (dgrad, wgrad).
`forward` also returns what the weight gradient will need of x ("saved"): x itself for bf16, an
8-bit copy quantized the way wgrad consumes it for the 8-bit backends, so the quantization happens
in the pass that already reads x and the saved activation is half the size. A backend also runs
the SwiGLU between its two GEMMs, so that it can have that kernel write the next GEMM's operands
in the form it consumes them (the MXFP8 backend does).
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from foldmill.moe.experts.swiglu import UnfusedSwiGLU


class ExpertGemm(Protocol):
    """One grouped linear layer y_e = x_e w_e^T, with its two backward GEMMs."""

    name: str
    # Expert groups are padded to a multiple of this many rows (the wgrad block size of 8-bit recipes).
    pad_multiple: int
    # Whether an expert with no tokens still needs a (zero) group: its GEMM may not write zeros otherwise.
    nonempty_groups: bool

    def forward(self, x: torch.Tensor, w: torch.Tensor, ends: torch.Tensor) -> tuple[torch.Tensor, object]:
        """((rows, N) = x_e w_e^T per group, what `backward` needs of x)."""

    def backward(
        self, dy: torch.Tensor, w: torch.Tensor, saved: object, ends: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(dx (rows, K) = dy_e w_e per group, dw (experts, N, K) = dy_e^T x_e per group)."""

    def swiglu_forward(self, h: torch.Tensor, row_probs: torch.Tensor) -> object:
        """SwiGLU's output a (experts.swiglu) in a form `forward` takes as x."""

    def saved_swiglu_input(self, h: torch.Tensor, a_saved: object) -> object:
        """What the backward pass keeps of h for `swiglu_backward`, given the second GEMM's `saved`."""

    def swiglu_backward(
        self, h: object, row_probs: torch.Tensor, grad_a: torch.Tensor
    ) -> tuple[object, torch.Tensor]:
        """(grad_h in a form `backward` takes as dy, grad_row_probs); h as `saved_swiglu_input` kept it."""


def group_bounds(ends: torch.Tensor) -> list[tuple[int, int]]:
    """[(start, end)] per expert (synchronizes with the device: loop backend and emulations only)."""
    stops = [int(v) for v in ends.tolist()]
    return list(zip([0, *stops[:-1]], stops))


class LoopGemm(UnfusedSwiGLU):
    """One matmul per expert in a Python loop: what Hugging Face's eager Mixtral does."""

    name = "loop"
    pad_multiple = 1
    nonempty_groups = False

    def forward(self, x, w, ends):
        out = x.new_zeros(x.shape[0], w.shape[1])
        for expert, (start, stop) in enumerate(group_bounds(ends)):
            if stop > start:
                out[start:stop] = x[start:stop] @ w[expert].t()
        return out, x

    def backward(self, dy, w, saved, ends):
        dx = dy.new_zeros(dy.shape[0], w.shape[2])
        dw = dy.new_zeros(ends.shape[0], dy.shape[1], saved.shape[1])
        for expert, (start, stop) in enumerate(group_bounds(ends)):
            if stop > start:
                dx[start:stop] = dy[start:stop] @ w[expert]
                dw[expert] = dy[start:stop].t() @ saved[start:stop]
        return dx, dw


class GroupedGemm(UnfusedSwiGLU):
    """bf16 grouped GEMM (`torch.nn.functional.grouped_mm`): one launch for all experts, no host sync."""

    name = "grouped"
    pad_multiple = 1
    nonempty_groups = False

    def forward(self, x, w, ends):
        return F.grouped_mm(x, w.transpose(-2, -1), offs=ends), x

    def backward(self, dy, w, saved, ends):
        return F.grouped_mm(dy, w, offs=ends), F.grouped_mm(dy.t(), saved, offs=ends)
