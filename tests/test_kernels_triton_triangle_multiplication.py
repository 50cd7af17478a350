"""The "triangle_multiplication" op's Triton backend (foldmill.kernels.triangle_multiplication.triton).

- The reference and the module with `residual_out` (x + update into x's own storage), and the backend's
  fallback to the reference where the kernels do not apply: always tested, triton or not.
- The kernels against float64 math under Triton's CPU interpreter (skipped where triton is not
  installed, e.g. CI), in a child process (this file run as a script).
- Every block configuration compiles for sm_90 within its shared memory (no GPU needed).
- GPU parity against the math, the reference and cuEquivariance's fused op, in place (gpu marker).
"""

from __future__ import annotations

import pytest
import torch
from kernel_testing import (
    BF16_TOL,
    FP32_TOL,
    H100_SHARED_MEMORY_BYTES,
    HAS_TRITON,
    local_memory_instructions,
    relative_error,
    run_interpreted,
    serve_cases,
    sm90_compiled,
)

from foldmill import kernels
from foldmill.kernels.triangle_multiplication import TriangleMultiplicationWeights
from foldmill.kernels.triangle_multiplication import triton as triton_triangle_multiplication
from foldmill.model.layers.triangle_multiplication import (
    TriangleMultiplicationIncoming,
    TriangleMultiplicationOutgoing,
    triangle_multiplication,
)

WEIGHT_NAMES = ("norm_in_w", "norm_in_b", "p_in", "g_in", "norm_out_w", "norm_out_b", "p_out", "g_out")


def op_inputs(batch: int, tokens: int, channels: int, seed: int, device: str = "cpu"):
    """x (B, N, N, C), a pair mask whose last two tokens are padding, and the op's weights."""
    generator = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, device=device)

    x = randn(batch, tokens, tokens, channels)
    token_mask = torch.ones(batch, tokens, device=device)
    token_mask[:, -2:] = 0
    mask = token_mask[:, :, None] * token_mask[:, None, :]
    scale = channels**-0.5
    weights = (
        1 + 0.2 * randn(channels),
        0.2 * randn(channels),
        randn(2 * channels, channels) * scale,
        randn(2 * channels, channels) * scale,
        1 + 0.2 * randn(channels),
        0.2 * randn(channels),
        randn(channels, channels) * scale,
        randn(channels, channels) * scale,
    )
    return x, mask, TriangleMultiplicationWeights(*weights)


def plain_update(x: torch.Tensor, direction: str, mask: torch.Tensor, weights: TriangleMultiplicationWeights) -> torch.Tensor:
    """The triangle multiplicative update written out in float64."""
    norm_in_w, norm_in_b, p_in, g_in, norm_out_w, norm_out_b, p_out, g_out = (w.double() for w in weights.tensors())

    def layer_norm(y, weight, bias):
        return (y - y.mean(-1, keepdim=True)) / torch.sqrt(y.var(-1, unbiased=False, keepdim=True) + 1e-5) * weight + bias

    normed = layer_norm(x.double(), norm_in_w, norm_in_b)
    edges = (normed @ p_in.T) * torch.sigmoid(normed @ g_in.T) * mask.double()[..., None]
    a, b = edges.chunk(2, dim=-1)
    equation = "bikc,bjkc->bijc" if direction == "outgoing" else "bkic,bkjc->bijc"
    product = layer_norm(torch.einsum(equation, a, b), norm_out_w, norm_out_b)
    return (product @ p_out.T) * torch.sigmoid(normed @ g_out.T)


@torch.no_grad()
@pytest.mark.parametrize("module_class", [TriangleMultiplicationOutgoing, TriangleMultiplicationIncoming])
def test_module_adds_its_update_into_residual_out(module_class):
    module = module_class(16).eval()
    x = torch.randn(1, 9, 9, 16, generator=torch.Generator().manual_seed(0))
    mask = torch.ones(1, 9, 9)
    update = module(x, mask)
    assert relative_error(update, plain_update(x, module.direction, mask, TriangleMultiplicationWeights(*module.state_dict().values()))) <= FP32_TOL
    own = x.clone()
    assert module(own, mask, residual_out=own) is own  # in place: x's own storage
    assert torch.equal(own, x + update)
    fresh = torch.empty_like(x)
    assert module(x, mask, residual_out=fresh) is fresh and torch.equal(fresh, x + update)


def test_module_state_dict_order_is_the_op_argument_order():
    """plain_update reads the module's weights in state-dict order: the op's argument order."""
    names = list(TriangleMultiplicationOutgoing(16).state_dict())
    assert names == ["norm_in.weight", "norm_in.bias", "p_in.weight", "g_in.weight", "norm_out.weight", "norm_out.bias",
                     "p_out.weight", "g_out.weight"]  # fmt: skip


def test_backend_runs_the_reference_where_the_kernels_do_not_apply():
    """Channel counts the kernels do not tile (24: not a power of two), and autograd recording."""
    x, mask, weights = op_inputs(1, 7, 24, seed=1)
    assert not triton_triangle_multiplication.supported(24) and triton_triangle_multiplication.supported(128)
    out = kernels.call_backend("triangle_multiplication", "triton", x, "outgoing", mask, weights)
    assert torch.equal(out, triangle_multiplication(x, "outgoing", mask, weights))
    x, mask, weights = op_inputs(1, 7, 16, seed=1)  # fp32 compute (no autocast): the reference's
    out = kernels.call_backend("triangle_multiplication", "triton", x, "outgoing", mask, weights)
    assert torch.equal(out, triangle_multiplication(x, "outgoing", mask, weights))
    x, mask, weights = op_inputs(1, 7, 16, seed=2)
    weights.p_in_weight.requires_grad_(True)
    out = kernels.call_backend("triangle_multiplication", "triton", x, "incoming", mask, weights)
    assert out.requires_grad
    assert torch.equal(out.detach(), triangle_multiplication(x, "incoming", mask, weights).detach())


# name, (batch, tokens, channels), compute dtype, direction, residual, (pairs, warps, stages) pinned for both
# kernels (None: their defaults).
# 70 tokens leave a partial pair block; 24 (a multiple of 8, as the model pads) and 2 x 12 run the edges
# kernel's 8- and 4-aligned forms; the fp32 cases are exact, the bf16 ones carry bf16 rounding.
INTERPRETER_CASES = [
    ("fp32_outgoing", (1, 13, 32), torch.float32, "outgoing", False, None),
    ("fp32_incoming_residual_24_tokens", (1, 24, 32), torch.float32, "incoming", True, (16, 4, 1)),
    ("bf16_outgoing_two_batches_12_tokens", (2, 12, 16), torch.bfloat16, "outgoing", False, None),
    ("fp32_incoming_residual", (2, 11, 16), torch.float32, "incoming", True, (32, 4, 1)),
    ("bf16_outgoing_residual", (1, 70, 16), torch.bfloat16, "outgoing", True, (64, 8, 3)),
    ("bf16_incoming_c128", (1, 10, 128), torch.bfloat16, "incoming", False, None),
]


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
def test_kernels_match_the_math_under_the_triton_interpreter(tmp_path):
    cases, inputs = [], {}
    for index, (name, shape, dtype, direction, residual, config) in enumerate(INTERPRETER_CASES):
        inputs[name] = op_inputs(*shape, seed=10 + index)
        x, mask, weights = inputs[name]
        cases.append({"name": name, "inputs": (x, mask, *weights.tensors()), "dtype": str(dtype), "direction": direction,
                      "residual": residual, "config": config})  # fmt: skip
    outputs = run_interpreted(__file__, cases, tmp_path)
    for name, _, dtype, direction, residual, _ in INTERPRETER_CASES:
        x, mask, weights = inputs[name]
        out = outputs[name]
        assert out.shape == x.shape and out.dtype == (torch.float32 if residual else dtype), name
        # With the residual, the update is small beside x: the error is measured on the update.
        update = out.double() - x.double() if residual else out
        error = relative_error(update, plain_update(x, direction, mask, weights))
        assert error <= (FP32_TOL if dtype == torch.float32 else BF16_TOL), (name, error)


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
def test_every_block_config_compiles_for_sm90_within_shared_memory(tmp_path):
    """Each kernel at its shipped config (and the other's), within an H100/H200 block's shared memory;
    the output kernel under its register cap without spilling."""
    from foldmill.kernels.triangle_multiplication.triton_kernel import (
        EDGES_CONFIG,
        OUTPUT_CONFIG,
        _gated_edges_kernel,
        _gated_output_kernel,
    )

    edges_signature = {name: "*bf16" for name in ("p_ptr", "g_ptr", "a_ptr", "b_ptr")}
    edges_signature |= {"x_ptr": "*fp32", "mask_ptr": "*fp32", "norm_weight_ptr": "*fp32", "norm_bias_ptr": "*fp32"}
    edges_signature |= dict.fromkeys(("tokens", "batch", "x_stride_b", "x_stride_i", "x_stride_k"), "i32")
    edges_signature |= dict.fromkeys(("mask_stride_b", "mask_stride_i", "mask_stride_k"), "i32") | {"eps": "fp32"}
    output_signature = {"product_ptr": "*bf16", "p_ptr": "*bf16", "g_ptr": "*bf16", "x_ptr": "*fp32", "out_ptr": "*fp32"}
    output_signature |= dict.fromkeys(("norm_in_weight_ptr", "norm_in_bias_ptr", "norm_out_weight_ptr", "norm_out_bias_ptr"), "*fp32")
    output_signature |= dict.fromkeys(("tokens", "batch", "x_stride_b", "x_stride_i", "x_stride_j"), "i32")
    output_signature |= dict.fromkeys(("out_stride_b", "out_stride_i", "out_stride_j"), "i32") | {"eps": "fp32"}
    flags = {"DOT_PRECISION": "tf32", "EMULATE_BF16": False}
    for config in (EDGES_CONFIG, OUTPUT_CONFIG):
        for kernel, signature, constants in (
            (_gated_edges_kernel, edges_signature, {"ALIGN": 8}),  # the model's token counts: multiples of 8
            (_gated_output_kernel, output_signature, {"RESIDUAL": True}),
        ):
            constants = {"C": 128, "BLOCK_P": config.block_p, **constants, **flags}
            compiled = sm90_compiled(
                kernel, signature, constants, config.num_warps, config.num_stages, config.max_registers
            )
            shared = compiled.metadata.shared
            assert shared <= H100_SHARED_MEMORY_BYTES, (kernel.__name__, config, shared)
            if config.max_registers is not None:
                assert f".maxnreg {config.max_registers}" in compiled.asm["ptx"], (kernel.__name__, config)
            if kernel is _gated_output_kernel and config == OUTPUT_CONFIG:
                assert local_memory_instructions(compiled, tmp_path) in (0, None), config


@pytest.mark.gpu
@pytest.mark.parametrize("direction", ["outgoing", "incoming"])
@pytest.mark.parametrize("batch, tokens, channels", [(1, 130, 128), (2, 67, 64), (1, 517, 128), (1, 264, 128)])
def test_backend_matches_the_math_on_the_gpu(direction, batch, tokens, channels):
    """bf16 through the registry: within BF16_TOL and no worse than 1.5x the reference's own bf16 error; in
    place with residual_out: x + that update, in x's storage. (fp32 is the interpreter test's.)"""
    x, mask, weights = op_inputs(batch, tokens, channels, seed=5, device="cuda")
    expected = plain_update(x, direction, mask, weights)
    with torch.no_grad():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            kernels.reset_counts()
            with kernels.kernel_policy(force={"triangle_multiplication": "triton"}):
                out = kernels.dispatch("triangle_multiplication", x, direction, mask, weights)
                own = x.clone()
                summed = kernels.dispatch("triangle_multiplication", own, direction, mask, weights, residual_out=own)
            reference_out = triangle_multiplication(x, direction, mask, weights)
    assert kernels.chosen_counts() == {"triangle_multiplication/triton": 2}
    assert out.dtype == torch.bfloat16 and out.shape == expected.shape
    error, reference_error = relative_error(out, expected), relative_error(reference_out, expected)
    assert error <= BF16_TOL and error <= 1.5 * reference_error, (error, reference_error)
    assert summed is own and summed.dtype == torch.float32
    assert relative_error(summed.double() - x.double(), expected) <= BF16_TOL


@pytest.mark.gpu
@pytest.mark.parametrize("direction", ["outgoing", "incoming"])
def test_backend_agrees_with_cuequivariance_on_the_gpu(direction):
    from foldmill.kernels import cueq

    if not cueq.available():
        pytest.skip("cuEquivariance's ops package is not installed")
    x, mask, weights = op_inputs(1, 300, 128, seed=6, device="cuda")
    expected = plain_update(x, direction, mask, weights)
    outputs = {}
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        for backend in ("triton", "cueq"):
            with kernels.kernel_policy(force={"triangle_multiplication": backend}):
                outputs[backend] = kernels.dispatch("triangle_multiplication", x, direction, mask, weights)
    errors = {name: relative_error(out, expected) for name, out in outputs.items()}
    assert errors["triton"] <= BF16_TOL and errors["triton"] <= 1.5 * errors["cueq"], errors


def _run_case(case: dict, dtype: torch.dtype) -> torch.Tensor:
    """Child process (TRITON_INTERPRET=1): one case through the kernels."""
    from foldmill.kernels.triangle_multiplication.triton_kernel import BlockConfig, fused_update

    x, mask, *weights = case["inputs"]
    config = None if case["config"] is None else BlockConfig(*case["config"])
    residual_out = x.clone() if case["residual"] else None
    return fused_update(x, case["direction"], mask, weights, 1e-5, dtype, residual_out, config)


if __name__ == "__main__":
    serve_cases(_run_case, patch_numpy=True)
