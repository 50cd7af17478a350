"""The "outer_product_mean" op (foldmill.kernels.outer_product_mean.triton).

- CPU routing to the reference, the reference against the mean written out, the exact row counts,
  and the backend's fallback where the kernel does not apply: always tested, triton or not.
- The kernel and the backend against the fp32 math under Triton's CPU interpreter (skipped where
  triton is not installed, e.g. CI), in a child process (this file run as a script).
- Every block configuration compiles for sm_90 within its shared memory (no GPU needed).
- GPU parity at the model's width and a deep MSA, and the whole MSA-module layer (gpu marker).
"""

from __future__ import annotations

import pytest
import torch
from kernel_testing import (
    BF16_TOL,
    FP32_TOL,
    H100_SHARED_MEMORY_BYTES,
    HAS_TRITON,
    assert_gpu_backend_parity,
    relative_error,
    run_interpreted,
    serve_cases,
    sm90_shared_memory,
    through_backend,
)

from foldmill import kernels
from foldmill.kernels.outer_product_mean import triton as triton_outer_product
from foldmill.model.layers.outer_product_mean import OuterProductMean, outer_product_mean


def op_inputs(batch: int, msa_rows: int, tokens: int, channels: int, out: int, seed: int, device: str = "cpu"):
    """Masked projections a, b (B, S, N, c), the MSA mask (~25% of the entries masked, one token
    masked in every row: a padding token), the projection's weight and bias."""
    generator = torch.Generator(device=device).manual_seed(seed)
    mask = (torch.rand(batch, msa_rows, tokens, generator=generator, device=device) > 0.25).float()
    mask[:, :, -1] = 0
    a = torch.randn(batch, msa_rows, tokens, channels, generator=generator, device=device) * mask[..., None]
    b = torch.randn(batch, msa_rows, tokens, channels, generator=generator, device=device) * mask[..., None]
    weight = torch.randn(out, channels * channels, generator=generator, device=device) / channels
    bias = torch.randn(out, generator=generator, device=device)
    return a, b, mask, weight, bias


def plain_mean(a, b, mask, weight, bias) -> torch.Tensor:
    """The outer product mean written out in float64."""
    a, b, mask = a.double(), b.double(), mask.double()
    counts = torch.einsum("bsi,bsj->bij", mask, mask).clamp(min=1)
    outer = torch.einsum("bsic,bsjd->bijcd", a, b).flatten(-2) / counts[..., None]
    return outer @ weight.double().T + bias.double()


def test_reference_is_the_masked_mean_and_cpu_routes_to_it():
    inputs = op_inputs(2, 7, 9, 4, 5, seed=0)
    kernels.reset_counts()
    out = kernels.dispatch("outer_product_mean", *inputs)
    assert kernels.chosen_counts() == {"outer_product_mean/reference": 1}
    assert relative_error(out, plain_mean(*inputs)) <= FP32_TOL


def test_module_routes_through_the_op_with_its_own_parameters():
    layer = OuterProductMean(c_in=6, c_hidden=4, c_out=5).eval()
    generator = torch.Generator().manual_seed(1)
    m = torch.randn(1, 5, 8, 6, generator=generator)
    mask = (torch.rand(1, 5, 8, generator=generator) > 0.3).float()
    kernels.reset_counts()
    with torch.no_grad():
        out = layer(m, mask)
        normed = layer.norm(m)
        a, b = layer.proj_a(normed) * mask[..., None], layer.proj_b(normed) * mask[..., None]
        expected = plain_mean(a, b, mask, layer.proj_o.weight, layer.proj_o.bias)
    assert kernels.chosen_counts() == {"outer_product_mean/reference": 1}
    assert relative_error(out, expected) <= FP32_TOL


def test_inverse_row_counts_are_exact():
    mask = (torch.rand(2, 3000, 6, generator=torch.Generator().manual_seed(2)) > 0.5).float()
    mask[:, :, 0] = 0
    expected = torch.einsum("bsi,bsj->bij", mask.double(), mask.double()).clamp(min=1)
    inverse = triton_outer_product.inverse_row_counts(mask)
    assert inverse.dtype == torch.float32
    assert torch.equal(inverse, (1 / expected).float())


def test_backend_runs_the_reference_where_the_kernel_does_not_apply():
    """Channel widths the kernel does not tile (8 here), and autograd recording (no backward)."""
    inputs = op_inputs(1, 6, 10, 8, 3, seed=3)
    out = kernels.call_backend("outer_product_mean", "triton", *inputs)
    assert torch.equal(out, outer_product_mean(*inputs))
    a, b, mask, weight, bias = op_inputs(1, 6, 10, 16, 3, seed=4)
    weight.requires_grad_(True)
    out = kernels.call_backend("outer_product_mean", "triton", a, b, mask, weight, bias)
    assert out.requires_grad and torch.equal(out.detach(), outer_product_mean(a, b, mask, weight, bias).detach())


# name, (batch, msa rows, tokens, channels, out), compute dtype, config index (None: default), via,
# row_start/rows for the kernel. Sizes leave partial MSA steps and tiles on both sides.
INTERPRETER_CASES = [
    ("kernel_fp32_c32", (1, 70, 13, 32, 8), torch.float32, None, "kernel", (0, 13)),
    ("kernel_fp32_c32_row_block", (2, 9, 11, 32, 8), torch.float32, 1, "kernel", (3, 5)),
    ("kernel_bf16_c32", (1, 130, 10, 32, 8), torch.bfloat16, 2, "kernel", (0, 10)),
    ("kernel_fp32_c16", (1, 33, 19, 16, 8), torch.float32, None, "kernel", (2, 17)),
    ("backend_bf16_c32", (2, 40, 12, 32, 16), torch.bfloat16, None, "backend", None),
    ("backend_fp32_c16", (1, 65, 9, 16, 16), torch.float32, None, "backend", None),
]


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
def test_kernel_matches_the_math_under_the_triton_interpreter(tmp_path):
    cases, expected = [], {}
    for index, (name, shape, dtype, config, via, rows) in enumerate(INTERPRETER_CASES):
        a, b, mask, weight, bias = op_inputs(*shape, seed=10 + index)
        if via == "kernel":
            start, count = rows
            expected[name] = torch.einsum("bsic,bsjd->bijcd", a[:, :, start : start + count].double(), b.double()).flatten(-2)
        else:
            expected[name] = plain_mean(a, b, mask, weight, bias)
        cases.append({"name": name, "inputs": (a, b, mask, weight, bias), "dtype": str(dtype), "config": config, "via": via, "rows": rows})
    outputs = run_interpreted(__file__, cases, tmp_path)
    for name, _, dtype, _, via, _ in INTERPRETER_CASES:
        out = outputs[name]
        assert out.shape == expected[name].shape and out.dtype == dtype, (name, out.shape, out.dtype)
        error = relative_error(out, expected[name])
        assert error <= (FP32_TOL if dtype == torch.float32 else BF16_TOL), (name, error)


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
def test_every_block_config_compiles_for_sm90_within_shared_memory():
    from foldmill.kernels.outer_product_mean.triton_kernel import CONFIGS, _outer_product_kernel, config_for

    signature = {"a_ptr": "*bf16", "b_ptr": "*bf16", "out_ptr": "*bf16"}
    signature |= dict.fromkeys(("msa_rows", "tokens", "row_start", "rows"), "i32")
    signature |= dict.fromkeys(("a_stride_b", "a_stride_s", "b_stride_b", "b_stride_s", "out_stride_b"), "i64")
    for channels in triton_outer_product.KERNEL_CHANNELS:
        for base in CONFIGS:
            config = config_for(channels, base)
            constants = {"C": channels, "BLOCK_I": config.block_i, "BLOCK_J": config.block_j, "BLOCK_S": config.block_s}
            constants |= {"DOT_PRECISION": "tf32", "EMULATE_BF16": False}
            shared = sm90_shared_memory(_outer_product_kernel, signature, constants, config.num_warps, config.num_stages)
            assert shared <= H100_SHARED_MEMORY_BYTES, (channels, config, shared)


@pytest.mark.gpu
@pytest.mark.parametrize("batch, tokens, msa_rows", [(2, 77, 100), (1, 200, 64), (1, 517, 1024)])
def test_backend_matches_the_math_on_the_gpu(batch, tokens, msa_rows):
    inputs = op_inputs(batch, msa_rows, tokens, 32, 128, seed=5, device="cuda")
    assert_gpu_backend_parity(
        "outer_product_mean", outer_product_mean, inputs, plain_mean(*inputs)
    )


def _run_case(case: dict, dtype: torch.dtype) -> torch.Tensor:
    """Child process (TRITON_INTERPRET=1): one case through the kernel or the backend."""
    from foldmill.kernels.outer_product_mean.triton_kernel import CONFIGS, outer_product_sum

    a, b, mask, weight, bias = case["inputs"]
    if case["via"] == "backend":
        return through_backend("outer_product_mean", dtype, a, b, mask, weight, bias, autocast=dtype != torch.float32)
    config = None if case["config"] is None else CONFIGS[case["config"]]
    start, count = case["rows"]
    return outer_product_sum(a, b, start, count, dtype, config)


if __name__ == "__main__":
    serve_cases(_run_case, patch_numpy=True)
