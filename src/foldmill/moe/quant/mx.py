"""MXFP8 quantization in plain torch (any device): the path used where Triton is not available.

Follows exactly the rules of `mx_reference` (RCEIL scales, NaN blocks, exponent clamped at -127);
`tests/test_moe_quant.py` checks it bit for bit against that emulation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BLOCK = 32
SCALE_NAN = 0xFF
_MANTISSA_1_75 = 0x600000


@dataclass
class MXTensor:
    """An MXFP8 tensor with blocks along its last dimension.

    `data`: float8_e4m3fn, shape (..., K); `scale`: uint8 E8M0 exponents, shape (..., K // 32).
    """

    data: torch.Tensor
    scale: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Exact float32 values (NaN where the block scale is NaN), cast to `dtype`."""
        factor = exponent_to_float(self.scale.to(torch.int32) - 127)
        factor = torch.where(self.scale == SCALE_NAN, torch.nan, factor)
        values = self.data.float().unflatten(-1, (-1, BLOCK)) * factor.unsqueeze(-1)
        return values.flatten(-2).to(dtype)


def exponent_to_float(exponent: torch.Tensor) -> torch.Tensor:
    """2^exponent as float32 for integer exponents in [-127, 127] (2^-127 is subnormal)."""
    normal = ((exponent.clamp(-126, 127) + 127) << 23).to(torch.int32).view(torch.float32)
    return torch.where(exponent < -126, torch.full_like(normal, 2.0**-127), normal)


def scale_exponent(amax: torch.Tensor) -> torch.Tensor:
    """RCEIL exponent (int32): smallest e with amax <= 448 * 2^e, clamped at -127."""
    bits = amax.float().contiguous().view(torch.int32)
    exponent_field = bits >> 23
    mantissa_above = ((bits & 0x7FFFFF) > _MANTISSA_1_75).to(torch.int32)
    exponent = torch.where(exponent_field == 0, -127, exponent_field - 135 + mantissa_above)
    return exponent.clamp_min(-127)


def quantize_mx(values: torch.Tensor) -> MXTensor:
    """Quantize along the last dimension (a multiple of 32) to MXFP8."""
    if values.shape[-1] % BLOCK:
        raise ValueError(f"MXFP8 needs the last dimension to be a multiple of {BLOCK}, got {values.shape[-1]}")
    blocks = values.float().reshape(*values.shape[:-1], -1, BLOCK)
    finite = torch.isfinite(blocks)
    not_finite = ~finite.all(dim=-1)
    amax = torch.where(finite, blocks, 0.0).abs().amax(dim=-1)
    exponent = scale_exponent(amax)
    # x * 2^-e is exact (a power-of-two product), so the cast below is the only rounding (RNE, saturating).
    scaled = blocks * exponent_to_float(-exponent).unsqueeze(-1)
    data = scaled.to(torch.float8_e4m3fn)
    data = torch.where(not_finite.unsqueeze(-1), torch.tensor(torch.nan, dtype=data.dtype, device=data.device), data)
    scale = torch.where(not_finite, SCALE_NAN, exponent + 127).to(torch.uint8)
    return MXTensor(data.flatten(-2), scale)
