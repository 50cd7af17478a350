"""MXFP8 backend: E4M3 elements with one E8M0 scale per 32 values along each GEMM's contraction dim.

forward  y = x w^T   blocks along K       (x row-wise, w row-wise)
dgrad    dx = dy w   blocks along N       (dy row-wise, w^T row-wise)
wgrad    dw = dy^T x blocks along tokens  (dy^T, x^T; expert groups padded to multiples of 32)
Each copy is quantized from the high-precision tensor. Where the GEMM runs:
- CUDA + Triton: kernels/mx_grouped_gemm.py (Hopper: FP8 MMAs per 32-wide block with the block
  scales applied in fp32; Blackwell: the native block-scaled MMA through tl.dot_scaled). PyTorch's
  MXFP8 scaled_grouped_mm is never called: on sm90 it launches an sm100 kernel that poisons the context.
- elsewhere: emulation (dequantize exactly, then a float32 grouped GEMM): the numerical reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from foldmill.moe.kernels import use_triton
from foldmill.moe.quant.mx import MXTensor, quantize_mx

BLOCK = 32


def quantize(values: torch.Tensor) -> MXTensor:
    """MXFP8 along the last dimension (Triton kernel on CUDA, torch elsewhere; bit-identical)."""
    if use_triton(values):
        from foldmill.moe.kernels.mx_quant import quantize_mx_triton

        return quantize_mx_triton(values)
    return quantize_mx(values)


def mx_grouped_mm(a: MXTensor, b: MXTensor, ends: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """(rows, N) = a_e b_e^T per group: a (rows, K), b (experts, N, K), both blocked along K."""
    if use_triton(a.data):
        from foldmill.moe.kernels.mx_grouped_gemm import mx_grouped_mm_triton

        return mx_grouped_mm_triton(a, b, ends, out_dtype)
    return F.grouped_mm(a.dequantize(), b.dequantize().transpose(-2, -1), offs=ends).to(out_dtype)


def mx_grouped_mm_wgrad(a: MXTensor, b: MXTensor, ends: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """(experts, N, K) = a[:, group] b[:, group]^T: a (N, rows), b (K, rows), both blocked along rows."""
    if use_triton(a.data):
        from foldmill.moe.kernels.mx_grouped_gemm import mx_grouped_mm_wgrad_triton

        return mx_grouped_mm_wgrad_triton(a, b, ends, out_dtype)
    return F.grouped_mm(a.dequantize(), b.dequantize().t(), offs=ends).to(out_dtype)


class MXFP8Gemm:
    name = "mxfp8"
    pad_multiple = BLOCK
    # The fused SwiGLU hands over its output already quantized for the second GEMM.
    quantized_input = True

    def forward(self, x, w, ends, x_quantized=None):
        x_mx = x_quantized if x_quantized is not None else quantize(x)
        return mx_grouped_mm(x_mx, quantize(w), ends, x.dtype)

    def dgrad(self, dy, w, ends):
        return mx_grouped_mm(quantize(dy), quantize(w.transpose(-2, -1)), ends, dy.dtype)

    def wgrad(self, dy, x, ends):
        return mx_grouped_mm_wgrad(quantize(dy.t()), quantize(x.t()), ends, dy.dtype)
