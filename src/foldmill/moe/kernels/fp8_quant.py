"""Triton row-wise FP8 quantizer: one program per row, amax pass then scale-and-cast pass.

Matches quant/fp8.py (scale = max(amax, 1e-12) / 448, elements x / scale rounded to nearest even)
up to the float32 division, which both compute the same way; used for the FP8 row-wise backend.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rowwise_kernel(x_ptr, data_ptr, scale_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = row * cols
    amax = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        values = tl.load(x_ptr + base + offs, mask=offs < cols, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(values))
    scale = tl.maximum(tl.max(amax, axis=0), 1e-12) / 448.0
    for start in range(0, cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        values = tl.load(x_ptr + base + offs, mask=offs < cols, other=0.0).to(tl.float32)
        tl.store(data_ptr + base + offs, (values / scale).to(tl.float8e4nv), mask=offs < cols)
    tl.store(scale_ptr + row, scale)


def quantize_rowwise_triton(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    values = values.contiguous()
    cols = values.shape[-1]
    rows = values.numel() // cols
    data = torch.empty(values.shape, dtype=torch.float8_e4m3fn, device=values.device)
    scale = torch.empty(values.shape[:-1], dtype=torch.float32, device=values.device)
    _rowwise_kernel[(rows,)](values, data, scale, cols, BLOCK=min(triton.next_power_of_2(cols), 2048), num_warps=4)
    return data, scale
