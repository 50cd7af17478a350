"""The "transition" op: CPU routing and reference math (always), and the fused Triton kernel's parity
under Triton's CPU interpreter (skipped where triton is not installed, e.g. CI).

The kernel runs in a child process (kernel_testing.run_interpreted: this file run as a script)
on inputs the test writes; the test compares its outputs with the fp32 reference. GPU parity and
CUDA-graph replay are in test_kernels_gpu.py.
"""

from __future__ import annotations

import pytest
import torch
from kernel_testing import (
    H100_SHARED_MEMORY_BYTES,
    HAS_TRITON,
    relative_error,
    run_interpreted,
    serve_cases,
    sm90_shared_memory,
    through_backend,
)
from torch.nn import functional as F

from foldmill import kernels
from foldmill.kernels import triton_support
from foldmill.kernels.transition import triton as triton_transition
from foldmill.model.layers.transition import Transition, transition

BF16_TOL, FP32_TOL = 1e-2, 1e-5


def weights(dim: int, hidden: int, out_dim: int, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        "norm_weight": 1 + 0.2 * torch.randn(dim, generator=generator),
        "norm_bias": 0.2 * torch.randn(dim, generator=generator),
        "fc1_weight": torch.randn(hidden, dim, generator=generator) / dim**0.5,
        "fc2_weight": torch.randn(hidden, dim, generator=generator) / dim**0.5,
        "fc3_weight": torch.randn(out_dim, hidden, generator=generator) / hidden**0.5,
    }


def plain_math(x: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
    """The transition written out: LayerNorm (eps 1e-5), SiLU-gated hidden layer, output projection."""
    x = x.float()
    normed = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-5)
    normed = normed * w["norm_weight"] + w["norm_bias"]
    a, b = normed @ w["fc1_weight"].T, normed @ w["fc2_weight"].T
    return (a * torch.sigmoid(a) * b) @ w["fc3_weight"].T


def test_cpu_routes_transition_to_the_reference():
    x = torch.zeros(1, 5, 5, 128)
    assert kernels.select("transition", x, 5) == kernels.REFERENCE
    with kernels.kernel_policy(force={"transition": "triton"}):  # CUDA-only backend: still the reference
        assert kernels.select("transition", x, 5) == kernels.REFERENCE
    assert kernels.backend_names("transition") == [kernels.REFERENCE, "triton"]
    assert isinstance(triton_support.available(), bool)


@torch.no_grad()
@pytest.mark.parametrize("chunk_size", [None, 24])
def test_transition_module_equals_the_plain_math(chunk_size):
    module = Transition(16, 64).eval()
    assert sorted(module.state_dict()) == ["fc1.weight", "fc2.weight", "fc3.weight", "norm.bias", "norm.weight"]
    w = weights(16, 64, 16, seed=3)
    module.load_state_dict(
        {
            "norm.weight": w["norm_weight"],
            "norm.bias": w["norm_bias"],
            "fc1.weight": w["fc1_weight"],
            "fc2.weight": w["fc2_weight"],
            "fc3.weight": w["fc3_weight"],
        }
    )
    x = torch.randn(2, 7, 7, 16, generator=torch.Generator().manual_seed(4))
    kernels.reset_counts()
    out = module(x, chunk_size)
    assert kernels.chosen_counts() == {"transition/reference": 1}
    torch.testing.assert_close(out, plain_math(x, w), rtol=1e-5, atol=1e-6)
    # Exactly the module's previous formula (nn.LayerNorm, then the three linears).
    hidden = module.norm(x)
    expected = module.fc3(F.silu(module.fc1(hidden)) * module.fc2(hidden))
    torch.testing.assert_close(out, expected, rtol=1e-6 if chunk_size else 0, atol=1e-6 if chunk_size else 0)


def test_backend_runs_the_reference_where_the_kernel_does_not_apply():
    assert triton_transition.supported(128, 128) and triton_transition.supported(384, 384)
    assert triton_transition.supported(64, 64) and triton_transition.supported(48, 32)
    assert not triton_transition.supported(768, 768) and not triton_transition.supported(8, 8)
    # Too wide for the kernel (the score model's 768-wide conditioner): the reference, triton or not.
    w = weights(768, 96, 768, seed=5)
    x = torch.randn(3, 768, generator=torch.Generator().manual_seed(6))
    torch.testing.assert_close(kernels.call_backend("transition", "triton", x, **w), transition(x, **w), rtol=0, atol=0)
    # Autograd recording: the kernel has no backward, so the reference runs and gradients flow.
    w = {name: value.requires_grad_() for name, value in weights(128, 512, 128, seed=7).items()}
    x = torch.randn(5, 128, generator=torch.Generator().manual_seed(8))
    out = kernels.call_backend("transition", "triton", x, **w)
    out.sum().backward()
    assert w["fc1_weight"].grad is not None and w["fc1_weight"].grad.abs().sum() > 0


# (name, leading shape of x, dim, hidden, out_dim, x dtype, compute dtype, block config index, how to run)
# "kernel" calls the launcher with an explicit block config; "backend" the registry backend under
# CPU autocast (its compute dtype and output dtype logic). Row counts are odd on purpose: the last
# program's rows are masked.
INTERPRETER_CASES = [
    ("fp32_7_rows", (7,), 128, 512, 128, torch.float32, torch.float32, None, "kernel"),
    ("bf16_fp32_input_1031_rows", (1031,), 128, 512, 128, torch.float32, torch.bfloat16, 0, "kernel"),
    ("bf16_input_1000_pair_rows", (1, 10, 100), 128, 512, 128, torch.bfloat16, torch.bfloat16, 1, "kernel"),
    ("fp16_95_rows", (5, 19), 128, 512, 128, torch.float32, torch.float16, 2, "kernel"),
    ("single_track_384_bf16", (37,), 384, 1536, 384, torch.float32, torch.bfloat16, None, "kernel"),
    ("single_track_384_fp32", (37,), 384, 1536, 384, torch.float32, torch.float32, None, "kernel"),
    ("padded_widths_fp32", (13,), 48, 96, 32, torch.float32, torch.float32, 0, "kernel"),  # hidden tail too
    ("strided_rows_fp32", (29,), 128, 512, 128, torch.float32, torch.float32, 3, "kernel"),
    ("backend_under_autocast", (3, 41), 128, 512, 128, torch.float32, torch.bfloat16, None, "backend"),
]


def _case_inputs(index: int, name: str, lead: tuple[int, ...], dim: int, hidden: int, out_dim: int, x_dtype):
    x = torch.randn(*lead, dim + 32, generator=torch.Generator().manual_seed(100 + index))
    x = x[..., :dim] if name.startswith("strided") else x[..., :dim].contiguous()  # rows dim + 32 apart
    return x.to(x_dtype), weights(dim, hidden, out_dim, seed=index)


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
def test_fused_kernel_matches_reference_under_the_triton_interpreter(tmp_path):
    cases, expected, torch_bf16_errors = [], {}, {}
    for index, (name, lead, dim, hidden, out_dim, x_dtype, dtype, config, via) in enumerate(INTERPRETER_CASES):
        x, w = _case_inputs(index, name, lead, dim, hidden, out_dim, x_dtype)
        cases.append({"name": name, "x": x, "weights": w, "dtype": str(dtype), "config": config, "via": via})
        expected[name] = plain_math(x, w)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            torch_bf16_errors[name] = relative_error(transition(x, **w), expected[name])
    outputs = run_interpreted(__file__, cases, tmp_path)
    for name, lead, dim, hidden, out_dim, x_dtype, dtype, config, via in INTERPRETER_CASES:
        out = outputs[name]
        assert out.shape == (*lead, out_dim) and out.dtype == dtype, name
        error = relative_error(out, expected[name])
        if dtype == torch.float32:
            assert error <= FP32_TOL, (name, error)
        else:
            assert error <= BF16_TOL, (name, error)
        if dtype == torch.bfloat16:  # rounding like the tensor cores: no worse than PyTorch's own bf16 path
            assert error <= 1.5 * torch_bf16_errors[name], (name, error, torch_bf16_errors[name])


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
def test_every_block_config_compiles_for_sm90_within_shared_memory():
    """Ahead-of-time compilation for sm_90 (no GPU needed): each autotuning candidate must build
    and fit in shared memory, else it could never launch on an H100/H200."""
    import triton

    from foldmill.kernels.transition.triton_kernel import NARROW_CONFIGS, WIDE_CONFIGS, _transition_kernel

    pointers = {"x_ptr": "*fp32", "out_ptr": "*bf16", "norm_weight_ptr": "*fp32", "norm_bias_ptr": "*fp32"}
    pointers |= {"fc1_ptr": "*bf16", "fc2_ptr": "*bf16", "fc3_ptr": "*bf16"}
    scalars = {"rows": "i32", "x_row_stride": "i32", "eps": "fp32"}
    for dim, configs in ((128, NARROW_CONFIGS), (384, WIDE_CONFIGS)):
        for config in configs:
            constants = {"DIM": dim, "HIDDEN": 4 * dim, "OUT_DIM": dim, "BLOCK_D": triton.next_power_of_2(dim)}
            constants |= {"BLOCK_O": constants["BLOCK_D"], "BLOCK_M": config.block_m, "BLOCK_H": config.block_h}
            constants |= {"DOT_PRECISION": "tf32", "EMULATE_BF16": False}
            signature = {**pointers, **scalars}
            shared = sm90_shared_memory(_transition_kernel, signature, constants, config.num_warps, config.num_stages)
            assert shared <= H100_SHARED_MEMORY_BYTES, (dim, config, shared)


def _run_case(case: dict, dtype: torch.dtype) -> torch.Tensor:
    """Child process (TRITON_INTERPRET=1): one case through the kernel or the backend."""
    from foldmill.kernels.transition.triton_kernel import candidates, fused_transition

    x, w = case["x"], case["weights"]
    if case["via"] == "backend":
        return through_backend("transition", dtype, x, **w)
    block_d = triton_support.padded_width(x.shape[-1])
    block_o = triton_support.padded_width(w["fc3_weight"].shape[0])
    config = None if case["config"] is None else candidates(block_d, block_o)[case["config"]]
    return fused_transition(x, *w.values(), 1e-5, dtype, config)


if __name__ == "__main__":
    serve_cases(_run_case)
