"""MXFP8 and FP8 quantizers: the torch quantizer bit for bit against the integer emulation."""

from __future__ import annotations

import numpy as np
import torch

from foldmill.moe.quant.fp8 import dequantize_rowwise, quantize_rowwise
from foldmill.moe.quant.mx import quantize_mx
from foldmill.moe.quant.mx_reference import (
    dequantize_mx_reference,
    e4m3_to_float_reference,
    quantize_mx_reference,
    scale_exponent_reference,
)


def adversarial(rows: int, cols: int, generator: torch.Generator) -> torch.Tensor:
    """Random blocks over ~60 binades plus zeros, NaN, Inf, subnormals, near-max and one binade per block."""
    x = torch.randn(rows, cols, generator=generator) * torch.exp(torch.randn(rows, 1, generator=generator) * 20)
    x[0, :32] = 0.0
    x[1, 3] = float("nan")
    x[2, 40] = float("inf")
    x[3, :32] = 1e-40  # subnormal block
    x[4, :32] = 3e38  # near the float32 maximum
    x[5, 64:96] = -0.0
    x[6, :32] = 448.0 * 2.0 ** torch.arange(-4, 28).float()
    return x


def assert_same_as_reference(x: torch.Tensor) -> None:
    q = quantize_mx(x)
    elements, scales = quantize_mx_reference(x.float().numpy())
    assert np.array_equal(q.data.view(torch.uint8).numpy(), elements)
    assert np.array_equal(q.scale.numpy(), scales)


def test_torch_quantizer_is_bit_exact_on_random_and_adversarial_blocks():
    generator = torch.Generator().manual_seed(0)
    assert_same_as_reference(adversarial(64, 256, generator))
    assert_same_as_reference(torch.randn(33, 4, 96, generator=generator).bfloat16())
    assert_same_as_reference(adversarial(32, 128, generator).t())  # a strided view


def test_special_blocks_follow_the_conventions():
    x = adversarial(8, 128, torch.Generator().manual_seed(1))
    q = quantize_mx(x)
    data = q.data.view(torch.uint8)
    assert q.scale[0, 0] == 0 and torch.all(data[0, :32] == 0)  # zeros: scale 2^-127
    assert q.scale[1, 0] == 0xFF and torch.all(data[1, :32] == 0x7F)  # NaN block
    assert q.scale[2, 1] == 0xFF and torch.all(torch.isnan(q.dequantize()[2, 32:64]))  # Inf block
    assert torch.all(data[5, 64:96] == 0x80)  # -0.0 keeps its sign
    assert q.scale[3, 0] == 0  # subnormal amax: exponent clamped at -127
    assert torch.count_nonzero(q.dequantize()[3, :32]) == 32  # ... and the values survive
    # 448 * 2^k with k = -4..27: the block max 448 * 2^27 needs scale 2^27; no element saturates
    assert int(q.scale[6, 0]) == 127 + 27


def test_rceil_scale_is_the_smallest_power_of_two_that_fits():
    amax = np.array([448.0, np.nextafter(np.float32(448.0), np.float32(1e9)), 449.0, 1.0, 1.75 * 2**-3, 2.0**-140, 0.0], dtype=np.float32)
    exponents = scale_exponent_reference(amax)
    assert exponents.tolist() == [0, 1, 1, -8, -11, -127, -127]
    for value, e in zip(amax[:5], exponents[:5]):
        assert value <= 448 * 2.0**e and value > 448 * 2.0 ** (e - 1)


def test_elements_round_to_nearest_even_like_the_hardware_cast():
    # Every float32 value on a fine grid in [-448, 448] (ties included): scale 2^0 blocks.
    grid = np.linspace(-448, 448, 32 * 4001, dtype=np.float32)
    grid[::32] = 448.0  # each block's max is 448, so the scale is 1 and elements are cast directly
    elements, scales = quantize_mx_reference(grid.reshape(-1, 32))
    assert np.all(scales == 127)
    cast = torch.from_numpy(grid.reshape(-1, 32)).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    assert np.array_equal(elements, cast)
    # ties: 1.0625 is halfway between 1.0 (even) and 1.125; 1.1875 between 1.125 and 1.25 (even)
    ties = np.array([448.0, 1.0625, 1.1875] + [0.0] * 29, dtype=np.float32)
    decoded = e4m3_to_float_reference(quantize_mx_reference(ties)[0])
    assert decoded[1] == 1.0 and decoded[2] == 1.25


def test_dequantized_values_are_exact_for_representable_inputs():
    rng = np.random.default_rng(2)
    codes = rng.integers(0, 0x7F, (16, 64)).astype(np.uint8)  # positive finite E4M3 codes
    codes[:, ::32] = 0x7E  # 448 in each block: scale 2^k exactly
    values = e4m3_to_float_reference(codes) * 2.0 ** rng.integers(-20, 20, (16, 1))
    elements, scales = quantize_mx_reference(values.astype(np.float32))
    assert np.array_equal(dequantize_mx_reference(elements, scales), values)


def test_fp8_rowwise_round_trip_error():
    x = torch.randn(64, 512) * torch.exp(torch.randn(64, 1) * 3)
    data, scale = quantize_rowwise(x)
    assert data.dtype == torch.float8_e4m3fn and scale.shape == (64,)
    back = dequantize_rowwise(data, scale)
    assert torch.all(data.float().abs().amax(dim=1) == 448)
    normal = x.abs() > x.abs().amax(dim=1, keepdim=True) * 2**-6  # above E4M3's subnormal range
    assert float(((back - x).abs() / x.abs())[normal].max()) <= 2**-4
