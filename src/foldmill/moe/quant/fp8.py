"""FP8 E4M3 with float32 scales: the 8-bit format Hopper's scaled grouped GEMM runs natively.

Row-wise: one scale per row over the last dimension (forward and dgrad operands). Group-column-wise:
one scale per (expert group, column) over the group's rows (weight-gradient operands, whose
contraction runs over tokens: a per-column scale constant within a group factors out of the sum).
"""

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


def quantize_group_columns(values: torch.Tensor, ends: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (rows, C) -> (elements transposed (C, rows) contiguous, scales (groups * C,) group-major).

    Rows past ends[-1] are padding: their elements are left unset (no GEMM reads them).
    """
    if use_triton(values):
        from foldmill.moe.kernels.fp8_quant import quantize_group_columns_triton

        return quantize_group_columns_triton(values, ends)
    rows, cols = values.shape
    data = torch.zeros((cols, rows), dtype=torch.float8_e4m3fn, device=values.device)
    scales = []
    stops = [int(stop) for stop in ends.tolist()]
    for start, stop in zip([0, *stops[:-1]], stops):
        block = values[start:stop].float()
        amax = block.abs().amax(dim=0) if stop > start else block.new_zeros(cols)
        scale = amax.clamp_min(_AMAX_FLOOR) / E4M3_MAX
        data[:, start:stop] = (block / scale).to(torch.float8_e4m3fn).t()
        scales.append(scale)
    return data, torch.cat(scales)


def quantize_weight_columns(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w (experts, N, K) -> (elements (experts, K, N) contiguous, scales (experts, K)), scaled over N."""
    if use_triton(weight):
        from foldmill.moe.kernels.fp8_quant import quantize_weight_columns_triton

        return quantize_weight_columns_triton(weight)
    return quantize_rowwise(weight.transpose(-2, -1))


def quantize_rows_and_group_columns(values: torch.Tensor, ends: torch.Tensor):
    """(quantize_rowwise(x), quantize_group_columns(x, ends)): every activation of the FP8 backend
    feeds one GEMM row-wise and the weight gradient per group column. On CUDA one kernel pair makes
    both; rows past ends[-1] may then be left unset."""
    if use_triton(values):
        from foldmill.moe.kernels.fp8_quant import quantize_rows_and_group_columns_triton

        return quantize_rows_and_group_columns_triton(values, ends)
    return quantize_rowwise(values), quantize_group_columns(values, ends)


def quantize_weight_copies(weight: torch.Tensor):
    """(quantize_rowwise(w), quantize_weight_columns(w)): the forward and dgrad copies of w
    (experts, N, K), made together once per optimizer step."""
    if use_triton(weight):
        from foldmill.moe.kernels.fp8_quant import quantize_weight_copies_triton

        return quantize_weight_copies_triton(weight)
    return quantize_rowwise(weight), quantize_weight_columns(weight)
