"""RMSNorm (float32 accumulation, returned in the input dtype), alone or after a residual add."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from foldmill.moe.kernels import use_triton


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight.to(x.dtype), self.eps)

    def add_and_norm(self, x: torch.Tensor, delta: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(h, norm(h)) for the residual stream h = x + delta (delta None: h = x). On CUDA one fused
        Triton kernel each way (moe/kernels/rms_norm.py), for x and delta of one dtype or a float32
        stream x taking a lower-precision delta (bf16-mixed); elsewhere, and under torch.compile, the
        add then torch's norm."""
        if delta is None:
            return x, self(x)
        mixed = x.dtype == torch.float32 and delta.dtype in (torch.bfloat16, torch.float16)
        if (x.dtype == delta.dtype or mixed) and use_triton(x) and not torch.compiler.is_compiling():
            from foldmill.moe.kernels.rms_norm import add_rms_norm_triton

            return add_rms_norm_triton(x, delta, self.weight, self.eps)
        h = x + delta
        return h, self(h)
