"""FP8 E4M3 row-wise backend: forward and dgrad through Hopper's FP8 scaled grouped GEMM.

Activations get one scale per row, weights one per output row of each expert (both over the
contraction dimension). The weight gradient stays in bf16: row-wise scales along the token
dimension would not factor out of a sum over tokens. Off CUDA the GEMMs are emulated
(dequantize, then the same grouped GEMM in float32), which gives the same numbers up to fp32 rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from foldmill.moe.experts.gemm import GroupedGemm
from foldmill.moe.quant.fp8 import dequantize_rowwise, quantize_rowwise


def scaled_grouped_mm_rowwise(x: torch.Tensor, w: torch.Tensor, ends: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """x (rows, K) @ w_e^T for w (experts, N, K), both quantized row-wise over K."""
    x_data, x_scale = quantize_rowwise(x)
    w_data, w_scale = quantize_rowwise(w)
    if x.is_cuda:
        # B must be column-major: the transpose of the (experts, N, K) row-major weights.
        return torch._scaled_grouped_mm(
            x_data, w_data.transpose(-2, -1), x_scale, w_scale, offs=ends, out_dtype=torch.bfloat16
        ).to(out_dtype)
    x_values = dequantize_rowwise(x_data, x_scale)
    w_values = dequantize_rowwise(w_data, w_scale)
    return F.grouped_mm(x_values, w_values.transpose(-2, -1), offs=ends).to(out_dtype)


class Fp8RowwiseGemm:
    name = "fp8_rowwise"
    # Hopper's FP8 grouped GEMM wants group boundaries on 16-row multiples.
    pad_multiple = 16
    quantized_input = False

    def __init__(self) -> None:
        self._bf16 = GroupedGemm()

    def forward(self, x, w, ends, x_quantized=None):
        return scaled_grouped_mm_rowwise(x, w, ends, x.dtype)

    def dgrad(self, dy, w, ends):
        # dy_e w_e contracts over N: quantize w^T (experts, K, N) row-wise over N.
        return scaled_grouped_mm_rowwise(dy, w.transpose(-2, -1).contiguous(), ends, dy.dtype)

    def wgrad(self, dy, x, ends):
        return self._bf16.wgrad(dy, x, ends)
