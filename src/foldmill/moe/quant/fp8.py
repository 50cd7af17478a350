"""FP8 E4M3 with one float32 scale per row: the 8-bit format Hopper's scaled grouped GEMM runs natively."""

from __future__ import annotations

import torch

from foldmill.moe.kernels import use_triton

E4M3_MAX = 448.0
# Keeps all-zero rows finite: their scale is tiny and their elements are zero.
_AMAX_FLOOR = 1e-12


def quantize_rowwise(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(float8_e4m3fn data, float32 dequantization scale per row over the last dimension)."""
    if use_triton(values):
        from foldmill.moe.kernels.fp8_quant import quantize_rowwise_triton

        return quantize_rowwise_triton(values)
    amax = values.abs().amax(dim=-1, keepdim=True).float().clamp_min(_AMAX_FLOOR)
    scale = amax / E4M3_MAX
    data = (values.float() / scale).to(torch.float8_e4m3fn)
    return data, scale.squeeze(-1)


def dequantize_rowwise(data: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return data.float() * scale.unsqueeze(-1)
