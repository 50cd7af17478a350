"""The "layer_norm" op: CPU routing, the row layout read in place, and the Triton kernel's parity
under Triton's CPU interpreter (skipped where triton is not installed, e.g. CI). The kernel runs in a
child process (TRITON_INTERPRET=1 must be set before triton is imported; see test_kernels_triton.py).
GPU parity is in test_kernels_gpu.py."""

from __future__ import annotations

import pytest
import torch
from kernel_testing import (
    H100_SHARED_MEMORY_BYTES,
    HAS_TRITON,
    local_memory_instructions,
    relative_error,
    run_interpreted,
    serve_cases,
    sm90_compiled,
)
from torch.nn import functional as F

from foldmill import kernels
from foldmill.kernels.layer_norm import triton as triton_layer_norm
from foldmill.model.layers.layer_norm import layer_norm


def test_cpu_routes_layer_norm_to_the_reference():
    x = torch.zeros(1, 5, 5, 128)
    assert kernels.select("layer_norm", x, 5) == kernels.REFERENCE
    assert kernels.backend_names("layer_norm") == [kernels.REFERENCE, "triton"]


def test_reference_returns_the_compute_dtype_with_fp32_statistics():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4, 6, 32, generator=generator) * 3 + 2
    weight, bias = torch.randn(32, generator=generator), torch.randn(32, generator=generator)
    expected = F.layer_norm(x, (32,), weight, bias, 1e-5)
    assert torch.equal(layer_norm(x, weight, bias, 1e-5), expected)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer_norm(x, weight, bias, 1e-5)
    assert out.dtype == torch.bfloat16 and torch.equal(out, expected.bfloat16())


def pair(n: int, width: int, seed: int) -> torch.Tensor:
    return torch.randn(1, n, n, width, generator=torch.Generator().manual_seed(seed)) * 2 + 0.5


@pytest.mark.parametrize(
    "make",
    [
        lambda: pair(5, 8, 1),  # contiguous: one row axis
        lambda: pair(5, 8, 1).transpose(1, 2),  # the ending-node view: two row axes, in place
        lambda: pair(5, 16, 1)[..., :8],  # rows 16 apart
        lambda: torch.randn(2, 5, 5, 8).transpose(1, 2),  # three row axes: copied
        lambda: torch.randn(8, 3)[:, :1].expand(8, 4),  # last axis strided: copied
    ],
)
def test_row_layout_addresses_every_row(make):
    x = make()
    source, inner, outer_stride, inner_stride = triton_layer_norm.row_layout(x)
    width = x.shape[-1]
    flat = source.as_strided((source.untyped_storage().nbytes() // source.element_size(),), (1,), 0)
    rows = x.reshape(-1, width)
    for r in range(rows.shape[0]):
        start = source.storage_offset() + (r // inner) * outer_stride + (r % inner) * inner_stride
        assert torch.equal(flat[start : start + width], rows[r]), r


def test_backend_runs_the_reference_where_the_kernel_does_not_apply():
    weight = torch.randn(16, requires_grad=True)
    x = torch.randn(3, 16)
    out = kernels.call_backend("layer_norm", "triton", x, weight, None, 1e-5)  # autograd recording: reference
    out.sum().backward()
    assert weight.grad is not None
    wide = torch.randn(2, 2048)
    torch.testing.assert_close(
        kernels.call_backend("layer_norm", "triton", wide, None, None, 1e-5), F.layer_norm(wide, (2048,)), rtol=0, atol=0
    )


# (name, input, weight/bias present, input dtype, output dtype)
CASES = [
    ("fp32_to_fp32", lambda: pair(9, 128, 2), True, torch.float32, torch.float32),
    ("fp32_to_bf16", lambda: pair(9, 128, 3), True, torch.float32, torch.bfloat16),
    ("bf16_to_bf16", lambda: pair(9, 128, 4), True, torch.bfloat16, torch.bfloat16),
    ("transposed_fp32_to_bf16", lambda: pair(9, 128, 5).transpose(1, 2), True, torch.float32, torch.bfloat16),
    ("single_track_384_no_affine", lambda: torch.randn(37, 384), False, torch.float32, torch.float32),
    ("odd_width_48_strided", lambda: pair(7, 64, 6)[..., :48], True, torch.float32, torch.float32),
]


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
def test_kernel_matches_the_fp32_reference_under_the_triton_interpreter(tmp_path):
    cases, expected = [], {}
    for index, (name, make, affine, in_dtype, out_dtype) in enumerate(CASES):
        x = make().to(in_dtype)
        width = x.shape[-1]
        generator = torch.Generator().manual_seed(50 + index)
        weight = 1 + 0.3 * torch.randn(width, generator=generator) if affine else None
        bias = 0.3 * torch.randn(width, generator=generator) if affine else None
        cases.append({"name": name, "x": x, "weight": weight, "bias": bias, "dtype": str(out_dtype)})
        expected[name] = F.layer_norm(x.float(), (width,), weight, bias, 1e-5)
    outputs = run_interpreted(__file__, cases, tmp_path, timeout=300)
    for name, make, affine, in_dtype, out_dtype in CASES:
        out = outputs[name]
        assert out.shape == expected[name].shape and out.dtype == out_dtype and out.is_contiguous(), name
        error = relative_error(out, expected[name])
        assert error <= (1e-6 if out_dtype == torch.float32 else 1e-2), (name, error)


@torch.no_grad()
def test_normed_and_heads_is_the_norm_and_the_projection_heads_first():
    """Plain modules (the reference model) and the compute-dtype LayerNorm of an inference copy (its op's
    reference on the CPU) give the norm and the (B, H, I, J) contiguous projection of it."""
    from foldmill.model.layers.layer_norm import LayerNorm, normed_and_heads

    generator = torch.Generator().manual_seed(7)
    norm, projection = LayerNorm(16), torch.nn.Linear(16, 4, bias=False)
    torch.nn.init.normal_(norm.weight, 1.0, 0.3, generator=generator)
    x = torch.randn(2, 5, 6, 16, generator=generator)
    expected_normed = norm(x)
    expected_heads = projection(expected_normed).permute(0, 3, 1, 2)
    normed, heads = normed_and_heads(norm, projection, x)
    assert torch.equal(normed, expected_normed) and torch.equal(heads, expected_heads) and heads.is_contiguous()
    norm.in_compute_dtype = True
    none, heads = normed_and_heads(norm, projection, x, keep_normed=False)
    assert none is None and relative_error(heads, expected_heads) <= 1e-6


# (name, input, heads, keep the norm, output dtype): the norm with the bias projection, heads first.
HEAD_CASES = [
    ("heads4_fp32_to_bf16", lambda: pair(9, 128, 7), 4, True, torch.bfloat16),
    ("heads16_transposed_bf16_heads_only", lambda: pair(9, 128, 8).transpose(1, 2), 16, False, torch.bfloat16),
    ("heads4_two_batches_rectangular_fp32", lambda: torch.randn(2, 5, 7, 64), 4, True, torch.float32),
]


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
def test_norm_with_heads_matches_the_fp32_reference_under_the_triton_interpreter(tmp_path):
    cases, expected = [], {}
    for index, (name, make, heads, keep_normed, out_dtype) in enumerate(HEAD_CASES):
        x = make()
        width = x.shape[-1]
        generator = torch.Generator().manual_seed(70 + index)
        weight = 1 + 0.3 * torch.randn(width, generator=generator)
        bias = 0.3 * torch.randn(width, generator=generator)
        head_weight = torch.randn(heads, width, generator=generator) / width**0.5
        cases.append({"name": name, "x": x, "weight": weight, "bias": bias, "dtype": str(out_dtype),
                      "head_weight": head_weight, "keep_normed": keep_normed})  # fmt: skip
        normed = F.layer_norm(x.float(), (width,), weight, bias, 1e-5)
        expected[name] = (normed, (normed @ head_weight.T).permute(0, 3, 1, 2))
    outputs = run_interpreted(__file__, cases, tmp_path, timeout=300)
    for name, _, heads, keep_normed, out_dtype in HEAD_CASES:
        normed, projected = outputs[name]
        tolerance = 1e-5 if out_dtype == torch.float32 else 1e-2
        assert projected.dtype == out_dtype and projected.is_contiguous(), name
        assert projected.shape == expected[name][1].shape, name
        assert relative_error(projected, expected[name][1]) <= tolerance, name
        if keep_normed:
            assert normed.dtype == out_dtype and relative_error(normed, expected[name][0]) <= tolerance, name
        else:
            assert normed is None, name


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
@pytest.mark.parametrize("keep_normed", [True, False])
def test_norm_with_heads_compiles_for_sm90(keep_normed, tmp_path):
    """Ahead-of-time compilation for sm_90 (no GPU needed), specialised as the trunk calls it (bf16 out,
    16-divisible pointers and strides): it must build, without spilling registers."""
    from foldmill.kernels.layer_norm.triton_kernel import HEAD_BLOCK, _layer_norm_heads_kernel

    names = _layer_norm_heads_kernel.arg_names
    pointers = {name: "*fp32" for name in names if name.endswith("_ptr")} | {"head_weight_ptr": "*bf16"}
    pointers |= {"normed_ptr": "*bf16", "heads_ptr": "*bf16"}
    scalars = {name: "i64" for name in ("rows", "plane", "inner", "outer_stride", "inner_stride")} | {"eps": "fp32"}
    constants = {"WIDTH": 128, "HEADS": 4, "BLOCK_H": HEAD_BLOCK, "BLOCK_R": 32, "KEEP_NORMED": keep_normed}
    constants |= {"DOT_PRECISION": "tf32", "EMULATE_BF16": False}
    divisible = [name for name in names if name in pointers or "stride" in name]
    signature = {**pointers, **scalars}
    compiled = sm90_compiled(_layer_norm_heads_kernel, signature, constants, 4, 3, divisible_by_16=divisible)
    assert compiled.metadata.shared <= H100_SHARED_MEMORY_BYTES
    assert local_memory_instructions(compiled, tmp_path) in (0, None)  # no spilled registers


def _run_case(case: dict, dtype: torch.dtype) -> torch.Tensor:
    """Child process (TRITON_INTERPRET=1): one case through the kernel."""
    from foldmill.kernels.layer_norm.triton_kernel import fused_layer_norm, fused_layer_norm_heads

    if "head_weight" in case:
        return fused_layer_norm_heads(
            case["x"], case["weight"], case["bias"], 1e-5, case["head_weight"], dtype, case["keep_normed"]
        )
    return fused_layer_norm(case["x"], case["weight"], case["bias"], 1e-5, dtype)


if __name__ == "__main__":
    serve_cases(_run_case)
