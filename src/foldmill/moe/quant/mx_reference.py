"""Bit-exact CPU emulation of the MXFP8 quantizer (integer arithmetic only): the reference for tests.

Format (OCP Microscaling v1.0): blocks of 32 consecutive values share one E8M0 scale (a power of two,
2^(byte - 127)); elements are FP8 E4M3 (max 448). Scale rule "RCEIL" (NVIDIA's): the smallest power
of two 2^e with amax <= 448 * 2^e, so elements never saturate. Our conventions, shared by every
quantizer in foldmill:
- a block holding NaN or +-Inf gets scale byte 0xFF (NaN) and all its elements 0x7F (NaN);
- the scale exponent is clamped below at -127 (byte 0): an all-zero block has scale byte 0;
- elements round to nearest, ties to even, keep the sign of zero, and saturate at 448.
Nothing here uses a floating-point cast, so it checks the torch and Triton quantizers independently.
"""

from __future__ import annotations

import numpy as np

BLOCK = 32
E4M3_MAX = 448.0
SCALE_NAN = 0xFF
ELEMENT_NAN = 0x7F
E4M3_MAX_BITS = 0x7E
# 448 = 1.75 * 2^8: amax needs one more power of two when its mantissa exceeds 1.75.
_MANTISSA_1_75 = 0x600000


def scale_exponent_reference(amax: np.ndarray) -> np.ndarray:
    """RCEIL exponent e (int64) for finite, non-negative float32 block maxima."""
    bits = amax.astype(np.float32).view(np.uint32).astype(np.int64)
    exponent_field = bits >> 23
    mantissa = bits & 0x7FFFFF
    # Subnormal or zero maxima need e < -127 and are clamped, so only normals are computed.
    exponent = np.where(exponent_field == 0, -127, exponent_field - 127 - 8 + (mantissa > _MANTISSA_1_75))
    return np.maximum(exponent, -127)


def _round_to_e4m3_bits(values: np.ndarray, exponent: np.ndarray) -> np.ndarray:
    """E4M3 bytes of values * 2^-exponent, rounded to nearest-even, computed on integers."""
    bits = values.astype(np.float32).view(np.uint32).astype(np.int64)
    sign = (bits >> 31) << 7
    exponent_field = (bits >> 23) & 0xFF
    significand = np.where(exponent_field == 0, bits & 0x7FFFFF, (bits & 0x7FFFFF) | 0x800000)
    # value = significand * 2^power (exactly), then scaled by 2^-exponent.
    power = np.where(exponent_field == 0, -149, exponent_field - 150) - exponent
    nonzero = significand != 0
    top_bit = np.floor(np.log2(np.maximum(significand, 1).astype(np.float64))).astype(np.int64)
    # Exponent of one unit in the last place of the E4M3 result (3 mantissa bits; subnormals 2^-9).
    ulp = np.maximum(top_bit + power - 3, -9)
    # Shifts past 30 leave nothing of a 24-bit significand; clamping keeps the int64 arithmetic exact.
    shift = np.minimum(ulp - power, 30)
    right = np.maximum(shift, 0)
    units = np.where(shift < 0, significand << np.maximum(-shift, 0), significand >> right)
    remainder = significand & ((1 << right) - 1)
    half = np.where(right > 0, 1 << np.maximum(right - 1, 0), 1 << 62)
    units = units + ((remainder > half) | ((remainder == half) & (units & 1 == 1)))
    carry = units >= 16  # rounding carried into the next binade
    units = np.where(carry, units >> 1, units)
    ulp = ulp + carry
    field = ulp + 10  # normal value = units/8 * 2^(ulp + 3), exponent bias 7
    saturate = (field > 15) | ((field == 15) & (units == 15))
    normal = np.where(saturate, E4M3_MAX_BITS, (field << 3) | (units - 8))
    out = np.where(units >= 8, normal, units)  # below 8 units: a subnormal in units of 2^-9
    out = np.where(nonzero, out, 0)
    return (out | sign).astype(np.uint8)


def quantize_mx_reference(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Quantize along the last axis (a multiple of 32): (E4M3 bytes, same shape; E8M0 bytes, last/32)."""
    values = np.asarray(values, dtype=np.float32)
    if values.shape[-1] % BLOCK:
        raise ValueError(f"last dimension {values.shape[-1]} is not a multiple of {BLOCK}")
    blocks = values.reshape(*values.shape[:-1], values.shape[-1] // BLOCK, BLOCK)
    not_finite = ~np.isfinite(blocks).all(axis=-1)
    amax = np.where(not_finite, 0.0, np.abs(np.where(np.isfinite(blocks), blocks, 0.0)).max(axis=-1))
    exponent = scale_exponent_reference(amax.astype(np.float32))
    elements = _round_to_e4m3_bits(blocks, exponent[..., None])
    elements = np.where(not_finite[..., None], np.uint8(ELEMENT_NAN), elements)
    scales = np.where(not_finite, SCALE_NAN, exponent + 127).astype(np.uint8)
    return elements.reshape(values.shape), scales


def e4m3_to_float_reference(elements: np.ndarray) -> np.ndarray:
    """Decode E4M3 bytes (float64, NaN for 0x7F/0xFF)."""
    elements = elements.astype(np.int64)
    sign = np.where(elements & 0x80, -1.0, 1.0)
    field, mantissa = (elements >> 3) & 0xF, elements & 7
    magnitude = np.where(field == 0, mantissa * 2.0**-9, (1 + mantissa / 8.0) * 2.0 ** (field - 7))
    magnitude = np.where((elements & 0x7F) == 0x7F, np.nan, magnitude)
    return sign * magnitude


def dequantize_mx_reference(elements: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """float64 values of an MXFP8 tensor (NaN where the scale is NaN)."""
    decoded = e4m3_to_float_reference(elements)
    blocks = decoded.reshape(*decoded.shape[:-1], decoded.shape[-1] // BLOCK, BLOCK)
    factor = np.where(scales == SCALE_NAN, np.nan, 2.0 ** (scales.astype(np.float64) - 127))
    return (blocks * factor[..., None]).reshape(decoded.shape)
