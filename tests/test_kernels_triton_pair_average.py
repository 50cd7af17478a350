"""The "pair_weighted_average" op (foldmill.kernels.pair_weighted_average.triton).

- CPU routing to the reference, the reference against the average written out, the module through
  the op, and the backend's fallback where the kernel does not apply: always tested.
- The kernel and the backend against float64 math under Triton's CPU interpreter (skipped where
  triton is not installed, e.g. CI), in a child process (this file run as a script).
- Every block configuration compiles for sm_90 within its shared memory (no GPU needed).
- GPU parity at the model's widths with a deep MSA (gpu marker).
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
from foldmill.kernels.pair_weighted_average import triton as triton_pair_average
from foldmill.model.layers.pair_weighted_average import PairWeightedAveraging, pair_weighted_average


def op_inputs(batch: int, msa_rows: int, tokens: int, heads: int, width: int, seed: int, device: str = "cpu"):
    """Softmax weights (B, H, N, N) with the last token masked out, and (B, S, N, H * D) values and
    gate logits as strided views of one (values | gate) projection, as the module makes them."""
    generator = torch.Generator(device=device).manual_seed(seed)
    logits = 2 * torch.randn(batch, heads, tokens, tokens, generator=generator, device=device)
    logits[..., -1] = -1e6
    projected = torch.randn(batch, msa_rows, tokens, 2 * heads * width, generator=generator, device=device)
    values, gate = projected.chunk(2, dim=-1)
    return logits.softmax(-1), values, gate


def plain_average(weights, values, gate) -> torch.Tensor:
    batch, msa_rows, tokens, total = values.shape
    heads = weights.shape[1]
    per_head = values.double().reshape(batch, msa_rows, tokens, heads, total // heads)
    out = torch.einsum("bhij,bsjhd->bsihd", weights.double(), per_head).reshape(batch, msa_rows, tokens, total)
    return torch.sigmoid(gate.double()) * out


def test_reference_is_the_gated_average_and_cpu_routes_to_it():
    inputs = op_inputs(2, 5, 7, 3, 4, seed=0)
    kernels.reset_counts()
    out = kernels.dispatch("pair_weighted_average", *inputs)
    assert kernels.chosen_counts() == {"pair_weighted_average/reference": 1}
    assert relative_error(out, plain_average(*inputs)) <= FP32_TOL


@pytest.mark.parametrize("chunk_heads", [False, True])
def test_module_is_algorithm_10_through_the_op(chunk_heads):
    layer = PairWeightedAveraging(c_m=6, c_z=5, c_h=4, num_heads=2).eval()
    generator = torch.Generator().manual_seed(1)
    m, z = torch.randn(1, 3, 7, 6, generator=generator), torch.randn(1, 7, 7, 5, generator=generator)
    mask = (torch.rand(1, 7, 7, generator=generator) > 0.2).float()
    with torch.no_grad():
        out = layer(m, z, mask, chunk_heads)
        mn, zn = layer.norm_m(m), layer.norm_z(z)
        logits = (zn @ layer.proj_z.weight.T).permute(0, 3, 1, 2) - (1 - mask[:, None]) * 1e6
        averaged = plain_average(logits.softmax(-1), mn @ layer.proj_m.weight.T, mn @ layer.proj_g.weight.T)
        expected = averaged @ layer.proj_o.weight.double().T
    assert relative_error(out, expected) <= FP32_TOL


def test_backend_runs_the_reference_where_the_kernel_does_not_apply():
    """Head widths the kernel does not tile (8 here), and autograd recording (no backward)."""
    inputs = op_inputs(1, 4, 6, 2, 8, seed=2)
    assert torch.equal(kernels.call_backend("pair_weighted_average", "triton", *inputs), pair_weighted_average(*inputs))
    weights, values, gate = op_inputs(1, 4, 6, 2, 16, seed=3)
    gate.requires_grad_(True)
    out = kernels.call_backend("pair_weighted_average", "triton", weights, values, gate)
    assert out.requires_grad and torch.equal(out.detach(), pair_weighted_average(weights, values, gate).detach())


# name, (batch, msa rows, tokens, heads, width), compute dtype, config index (None: default), via.
# Sizes leave partial tiles on every side.
INTERPRETER_CASES = [
    ("kernel_fp32_d32", (1, 9, 70, 2, 32), torch.float32, None, "kernel"),
    ("kernel_fp32_d16_batch2", (2, 5, 13, 3, 16), torch.float32, 2, "kernel"),
    ("kernel_bf16_d32", (1, 11, 66, 1, 32), torch.bfloat16, 1, "kernel"),
    ("backend_bf16_d32", (1, 6, 20, 2, 32), torch.bfloat16, None, "backend"),
]


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
def test_kernel_matches_the_math_under_the_triton_interpreter(tmp_path):
    cases, expected = [], {}
    for index, (name, shape, dtype, config, via) in enumerate(INTERPRETER_CASES):
        inputs = op_inputs(*shape, seed=10 + index)
        expected[name] = plain_average(*inputs)
        cases.append({"name": name, "inputs": inputs, "dtype": str(dtype), "config": config, "via": via})
    outputs = run_interpreted(__file__, cases, tmp_path)
    for name, _, dtype, _, _ in INTERPRETER_CASES:
        out = outputs[name]
        assert out.shape == expected[name].shape and out.dtype == dtype, (name, out.shape, out.dtype)
        error = relative_error(out, expected[name])
        assert error <= (FP32_TOL if dtype == torch.float32 else BF16_TOL), (name, error)


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
def test_every_block_config_compiles_for_sm90_within_shared_memory():
    from foldmill.kernels.pair_weighted_average.triton_kernel import CONFIGS, _pair_average_kernel

    signature = {"weights_ptr": "*bf16", "values_ptr": "*bf16", "gate_ptr": "*bf16", "out_ptr": "*bf16"}
    signature |= {"msa_rows": "i32", "tokens": "i32"}
    for tensor in ("weights", "values", "gate", "out"):
        axes = ("b", "h", "i") if tensor == "weights" else ("b", "s", "j" if tensor == "values" else "i")
        signature |= {f"{tensor}_stride_{axis}": "i64" for axis in axes}
    for width in triton_pair_average.KERNEL_HEAD_WIDTHS:
        for config in CONFIGS:
            constants = {"HEADS": 8, "D": width, "BLOCK_I": config.block_i, "BLOCK_S": config.block_s, "BLOCK_J": config.block_j}
            constants |= {"DOT_PRECISION": "tf32", "EMULATE_BF16": False}
            shared = sm90_shared_memory(_pair_average_kernel, signature, constants, config.num_warps, config.num_stages)
            assert shared <= H100_SHARED_MEMORY_BYTES, (width, config, shared)


@pytest.mark.gpu
@pytest.mark.parametrize("batch, tokens, msa_rows, heads", [(2, 77, 30, 2), (1, 200, 64, 8), (1, 517, 1024, 1)])
def test_backend_matches_the_math_on_the_gpu(batch, tokens, msa_rows, heads):
    inputs = op_inputs(batch, msa_rows, tokens, heads, 32, seed=5, device="cuda")
    assert_gpu_backend_parity(
        "pair_weighted_average", pair_weighted_average, inputs, plain_average(*inputs)
    )


def _run_case(case: dict, dtype: torch.dtype) -> torch.Tensor:
    """Child process (TRITON_INTERPRET=1): one case through the kernel or the backend."""
    from foldmill.kernels.pair_weighted_average.triton_kernel import CONFIGS
    from foldmill.kernels.pair_weighted_average.triton_kernel import pair_weighted_average as kernel

    if case["via"] == "backend":
        return through_backend("pair_weighted_average", dtype, *case["inputs"])
    config = None if case["config"] is None else CONFIGS[case["config"]]
    return kernel(*case["inputs"], dtype, config)


if __name__ == "__main__":
    serve_cases(_run_case, patch_numpy=True)
