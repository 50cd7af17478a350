"""FP8 E4M3 backend: all three GEMMs of each grouped linear layer through Hopper's FP8 scaled grouped GEMM.

forward  y = x w^T    x row-wise over K, w row-wise over K (per expert output row)
dgrad    dx = dy w    dy row-wise over N, w per (expert, k) over N
wgrad    dw = dy^T x  dy and x per (expert group, column) over the group's tokens: constant within
                      each expert's sum over tokens, so the scales factor out of it
Every operand is needed in two layouts: x row-wise (forward) and per group column (wgrad), dy
row-wise (dgrad) and per group column (wgrad), w row-wise (forward) and per (expert, k) (dgrad).
One quantizer call makes both from the same reads. The weights' copies are made once per optimizer
step (experts.weights.WeightCache), or, with `keep_weight_copies` off (`moe.keep_weight_copies`),
each GEMM's one layout when it runs, dropped after it: the same values for less peak memory; x's
weight-gradient copy is made in the forward pass and saved instead of x. Off CUDA the GEMMs are
emulated (dequantize, then the same grouped GEMM in float32), which gives the same numbers up to
fp32 rounding.

Fast accumulation (`moe.fp8_fast_accumulation`, on by default) lets Hopper's FP8 tensor cores keep
their partial sums without promoting them to fp32 every few K blocks, as torchao's FP8 MoE training
does: on the H200 the three GEMMs run 16-27% faster and the captured bio_8x1b FP8 training step
1.04x bf16's instead of 0.98x, and the forward's error against an fp32 product of the same FP8
operands goes from 0.17% to 0.21% (the FP8 rounding of the operands: 3.7%). The loss-parity runs
end within 1% of bf16 either way, closer than bf16's own spread across seeds
(docs/benchmarks/moe.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from foldmill.moe.experts.swiglu import UnfusedSwiGLU
from foldmill.moe.experts.weights import WeightCache
from foldmill.moe.quant.fp8 import (
    quantize_rows_and_group_columns,
    quantize_rowwise,
    quantize_weight_columns,
    quantize_weight_copies,
)


def scaled_grouped_mm(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
                      ends: torch.Tensor, out_dtype: torch.dtype, fast_accumulation: bool) -> torch.Tensor:
    """a (M, K) row-major FP8 times b column-major FP8, grouped by `ends`, with per-row scales.

    b is (experts, K, N) for the 2d-3d case (scales (experts, N)) or (K, N) for the 2d-2d case
    (groups split K; scales (groups * M,) and (groups * N,)). The emulation off CUDA accumulates
    in fp32 either way.
    """
    if a.is_cuda:
        return torch._scaled_grouped_mm(a, b, a_scale, b_scale, offs=ends, out_dtype=torch.bfloat16,
                                        use_fast_accum=fast_accumulation).to(out_dtype)
    a_values, b_values = a.float(), b.float()
    if b.dim() == 3:
        a_values = a_values * a_scale.unsqueeze(-1)
        b_values = b_values * b_scale.unsqueeze(-2)
        return F.grouped_mm(a_values, b_values, offs=ends).to(out_dtype)
    groups = ends.shape[0]
    out = F.grouped_mm(a_values, b_values, offs=ends)
    return (out * a_scale.view(groups, -1, 1) * b_scale.view(groups, 1, -1)).to(out_dtype)


class Fp8RowwiseGemm(UnfusedSwiGLU):
    name = "fp8_rowwise"
    # Hopper's FP8 grouped GEMM wants group boundaries on 16-row multiples.
    pad_multiple = 16
    # Zero-row groups of the 2d-2d scaled grouped GEMM (wgrad) are not documented to come out zero.
    nonempty_groups = True

    def __init__(self, fast_accumulation: bool, keep_weight_copies: bool = True) -> None:
        self.weights = WeightCache() if keep_weight_copies else None
        self.fast_accumulation = fast_accumulation

    def _weight_copy(self, layout: str, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """w's (elements, scales) for the forward GEMM (row-wise over K) or for dgrad (per (expert, k)
        over N): kept for the optimizer step, or made for this call."""
        if self.weights is not None:  # both layouts from the same reads, for the rest of the step
            rows, columns = self.weights.get("copies", w, quantize_weight_copies)
            return rows if layout == "forward" else columns
        return quantize_rowwise(w) if layout == "forward" else quantize_weight_columns(w)

    def forward(self, x, w, ends):
        (x_data, x_scale), x_columns = quantize_rows_and_group_columns(x, ends)
        w_data, w_scale = self._weight_copy("forward", w)
        y = scaled_grouped_mm(x_data, x_scale, w_data.transpose(-2, -1), w_scale, ends, x.dtype,
                              self.fast_accumulation)
        return y, x_columns

    def backward(self, dy, w, saved, ends):
        dy_rows, dy_columns = quantize_rows_and_group_columns(dy, ends)
        return self.dgrad(dy_rows, w, ends, dy.dtype), self.wgrad(dy_columns, saved, ends, dy.dtype)

    def dgrad(self, dy_rows, w, ends, out_dtype):
        """dy_rows: dy's row-wise copy."""
        dy_data, dy_scale = dy_rows
        wt_data, wt_scale = self._weight_copy("dgrad", w)
        return scaled_grouped_mm(dy_data, dy_scale, wt_data.transpose(-2, -1), wt_scale, ends, out_dtype,
                                 self.fast_accumulation)

    def wgrad(self, dy_columns, saved, ends, out_dtype):
        """dy_columns, saved: dy's and x's (elements (C, rows), scales) per (group, column)."""
        dy_data, dy_scale = dy_columns
        x_data, x_scale = saved
        return scaled_grouped_mm(dy_data, dy_scale, x_data.t(), x_scale, ends, out_dtype, self.fast_accumulation)
