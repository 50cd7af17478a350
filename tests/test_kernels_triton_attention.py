"""The Triton flash triangle-attention backend (foldmill.kernels.triangle_attention.triton).

- Where the kernel does not apply (autograd recording, head dims other than 16/32/64) the backend
  runs the reference: always tested, triton or not.
- The kernel's parity with `triangle_attention` under Triton's CPU interpreter (skipped where
  triton is not installed, e.g. CI). TRITON_INTERPRET=1 must be set before triton is imported, so
  the kernel runs in a child process (this file run as a script) on inputs the test writes.
- Every block configuration compiles for sm_90 within its shared memory (no GPU needed).
- GPU parity at the model's sizes, masked rows, block configs and CUDA-graph replay (gpu marker).

Inputs are laid out as the model hands them over: q, k, v strided views of one (B, I, J, 4*H*D)
projection (GatedAttention), the bias a permuted (B, J, J, H) projection (TriangleAttention).
Rows without any valid key (padding) only need finite values; the others are compared.
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
    sm90_compiled,
    through_backend,
)

from foldmill import kernels
from foldmill.kernels import triton_support
from foldmill.kernels.triangle_attention import triton as triton_triangle_attention
from foldmill.model.layers.triangle_attention import GatedAttention, gated_triangle_attention, triangle_attention

BF16_TOL, FP32_TOL = 1e-2, 1e-5
HEADS = 4


def model_inputs(
    batch: int,
    rows: int,
    tokens: int,
    head_dim: int,
    seed: int,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    row_offset: int = 0,
    with_gate: bool = False,
    token_mask: bool = False,
) -> tuple[torch.Tensor, ...]:
    """q, k, v, bias, mask as TriangleAttention/GatedAttention produce them (in `dtype`), for `rows` rows
    starting at `row_offset` of a larger pair (a row chunk, as with chunk_size), and with_gate the gate
    (B, rows, J, H*D) view too. The same seed gives the same values in every dtype. Keys ~30% masked;
    with several rows, row 0 fully masked (a padding row). With token_mask, the mask is instead the
    pair mask of a token mask, as the model's: token 3 and the last tokens/8 + batch padding, so their
    rows are fully masked and every other row's mask is the valid tokens (the kernel's folded path)."""
    generator = torch.Generator(device=device).manual_seed(seed)
    projected = torch.randn(batch, row_offset + rows, tokens, 4 * HEADS * head_dim, generator=generator, device=device)
    heads = GatedAttention(1, head_dim, HEADS)._heads
    q, k, v, gate = projected.to(dtype)[:, row_offset:].chunk(4, dim=-1)
    bias = 2 * torch.randn(batch, tokens, tokens, HEADS, generator=generator, device=device)
    mask = torch.rand(batch, rows, 1, 1, tokens, generator=generator, device=device) > 0.3
    if rows > 1:
        mask[:, 0] = False
    if token_mask:
        valid = torch.arange(row_offset + rows + tokens, device=device) < tokens - tokens // 8
        valid = torch.stack([valid & (torch.arange(valid.numel(), device=device) < tokens - b) for b in range(batch)])
        valid[:, 3] = False
        mask = valid[:, row_offset : row_offset + rows, None] & valid[:, None, :tokens]
        mask = mask.view(batch, rows, 1, 1, tokens)
    inputs = (heads(q), heads(k), heads(v), bias.to(dtype).permute(0, 3, 1, 2).unsqueeze(1), mask)
    return (*inputs, gate) if with_gate else inputs


def valid_rows(mask: torch.Tensor) -> torch.Tensor:
    """(I,) rows of batch 0 with at least one valid key."""
    return mask[0].flatten(1).any(-1)


def test_backend_runs_the_reference_where_the_kernel_does_not_apply():
    supported = [triton_triangle_attention.supported(d) for d in (8, 16, 24, 32, 64, 128)]
    assert supported == [False, True, False, True, True, False]
    if not torch.cuda.is_available():
        assert triton_support.available() is False
    # Head dim 24: not a kernel width, the reference runs (triton or not).
    q, k, v, bias, mask = model_inputs(1, 3, 10, 24, seed=1)
    out = kernels.call_backend("triangle_attention", "triton", q, k, v, bias, mask, 24**-0.5)
    torch.testing.assert_close(out, triangle_attention(q, k, v, bias, mask, 24**-0.5), rtol=0, atol=0)
    # Autograd recording: the kernel has no backward, so the reference runs and gradients flow.
    q, k, v, bias, mask = model_inputs(1, 3, 10, 32, seed=2)
    q = q.detach().requires_grad_()
    out = kernels.call_backend("triangle_attention", "triton", q, k, v, bias, mask, 32**-0.5)
    torch.testing.assert_close(out, triangle_attention(q, k, v, bias, mask, 32**-0.5), rtol=0, atol=0)
    out.sum().backward()
    assert q.grad is not None and q.grad.abs().sum() > 0


# (name, batch, rows, tokens, head dim, compute dtype, bias: "model" (permuted, bf16/fp32 as the
# compute dtype) | "fp32_contiguous", block config (BLOCK_M, BLOCK_N, warps, stages) or None for the
# default, L2 group size in queries, how to run, token mask: the model's kind of mask (the folded
# path). 40 and 136 tokens are not multiples of the blocks;
# 16 x 16 blocks with 32-query groups give several query/key blocks and a partial last group; odd row
# counts leave the last row pair half empty. "backend" runs the registry backend under CPU autocast.
INTERPRETER_CASES = [
    ("fp32_d32_small_blocks", 1, 3, 40, 32, torch.float32, "model", (16, 16, 4, 2), 32, "kernel", False),
    ("fp32_d16_default_blocks", 1, 3, 40, 16, torch.float32, "model", None, 1024, "kernel", False),
    ("bf16_d32_small_blocks", 1, 3, 40, 32, torch.bfloat16, "model", (16, 32, 4, 2), 16, "kernel", False),
    ("bf16_d16_fp32_bias", 1, 2, 40, 16, torch.bfloat16, "fp32_contiguous", None, 1024, "kernel", False),
    ("bf16_d64_two_batches", 2, 2, 136, 64, torch.bfloat16, "model", None, 1024, "kernel", False),
    ("fp32_d64_136_tokens", 1, 1, 136, 64, torch.float32, "model", (64, 64, 4, 3), 1024, "kernel", False),
    ("backend_under_autocast", 1, 5, 24, 32, torch.bfloat16, "fp32_contiguous", None, 1024, "backend", False),
    ("fp32_d32_token_mask", 1, 5, 40, 32, torch.float32, "model", (16, 16, 4, 2), 32, "kernel", True),
    ("bf16_d32_token_mask_default_blocks", 1, 6, 44, 32, torch.bfloat16, "model", None, 1024, "kernel", True),
    ("fp32_d16_token_mask_two_batches", 2, 4, 40, 16, torch.float32, "model", (16, 32, 4, 2), 1024, "kernel", True),
]


def _case_inputs(
    index: int, batch: int, rows: int, tokens: int, head_dim: int, dtype, bias_layout: str, token_mask: bool
):
    """fp32 inputs for the reference, and the same values in `dtype` for the kernel."""
    exact = model_inputs(batch, rows, tokens, head_dim, seed=100 + index, row_offset=1, token_mask=token_mask)
    *low, low_bias, mask = model_inputs(
        batch, rows, tokens, head_dim, seed=100 + index, dtype=dtype, row_offset=1, token_mask=token_mask
    )
    if bias_layout == "fp32_contiguous":
        low_bias = exact[3].contiguous()
    return exact[:4], (*low, low_bias, mask)


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
def test_flash_kernel_matches_reference_under_the_triton_interpreter(tmp_path):
    cases, expected, valid, torch_bf16_errors = [], {}, {}, {}
    for index, case in enumerate(INTERPRETER_CASES):
        name, batch, rows, tokens, head_dim, dtype, bias_layout, *_, token_mask = case
        exact, low = _case_inputs(index, batch, rows, tokens, head_dim, dtype, bias_layout, token_mask)
        q, k, v, bias = exact
        mask, scale = low[-1], head_dim**-0.5
        assert not low[0].is_contiguous() and low[0].stride(-1) == 1  # as GatedAttention hands them over
        expected[name] = triangle_attention(q, k, v, bias, mask, scale)
        valid[name] = valid_rows(mask)
        assert 0 < int(valid[name].sum()) and (rows == 1 or int(valid[name].sum()) < rows)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            reference_bf16 = triangle_attention(q, k, v, bias, mask, scale)
        torch_bf16_errors[name] = relative_error(reference_bf16[:, valid[name]], expected[name][:, valid[name]])
        cases.append({"name": name, "inputs": low, "scale": scale, "dtype": str(dtype)})
        cases[-1] |= dict(zip(("config", "group_queries", "via"), case[-4:-1], strict=True))
    outputs = run_interpreted(__file__, cases, tmp_path)
    for name, batch, rows, tokens, head_dim, dtype, *_ in INTERPRETER_CASES:
        out = outputs[name]
        assert out.shape == (batch, rows, HEADS, tokens, head_dim) and out.dtype == dtype, name
        assert torch.isfinite(out).all(), name  # fully masked rows included
        error = relative_error(out[:, valid[name]], expected[name][:, valid[name]])
        if dtype == torch.float32:
            assert error <= FP32_TOL, (name, error)
        else:  # rounding like the tensor cores: no worse than PyTorch's own bf16 path
            assert error <= BF16_TOL and error <= 1.5 * torch_bf16_errors[name], (name, error, torch_bf16_errors[name])


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
def test_masks_fold_the_key_mask_that_rows_share():
    """A token mask's pair mask: every valid row conforms (the folded path), padding rows do not, and
    the shared key bias masks exactly the padding keys; per-row random masks: no row conforms."""
    from foldmill.kernels.triangle_attention.triton_kernel import MASK_LOGIT, _row_masks, _shared_key_bias

    *_, mask = model_inputs(2, 6, 40, 16, seed=3, row_offset=1, token_mask=True)
    shared = _shared_key_bias(mask, 2, 6, 40, torch.bfloat16)
    per_row, conforming = _row_masks(mask, shared, 6, torch.bfloat16)
    tokens_valid = mask[:, :, 0, 0, :].any(1)
    assert torch.equal(conforming.bool(), mask[:, :, 0, 0, :].any(-1))  # row 2 (token 3) is padding
    assert not conforming[:, 2].any() and conforming[:, [0, 1, 3, 4, 5]].all()
    assert torch.equal(shared == MASK_LOGIT, ~tokens_valid) and (shared[tokens_valid] == 0).all()
    assert per_row.shape == (2, 6, 256) and (per_row[:, :, 40:] == MASK_LOGIT).all()
    *_, random_mask = model_inputs(1, 6, 40, 16, seed=3)
    shared = _shared_key_bias(random_mask, 1, 6, 40, torch.float32)
    assert not _row_masks(random_mask, shared, 6, torch.float32)[1].any()


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
def test_row_blocks_of_one_bias_share_its_folded_copy():
    """With `prepared`, the bias is folded once, at the first block, and later blocks on the same bias
    reuse that copy; another bias is folded again (`prepared` lives for one module call: its bias is not
    written in between)."""
    from foldmill.kernels.triangle_attention.triton_kernel import _prepared_bias

    *_, bias, mask = model_inputs(1, 6, 40, 16, seed=4, row_offset=1, token_mask=True)
    prepared: dict = {}
    shared, folded = _prepared_bias(bias, mask[:, :3], 1, 3, torch.float32, prepared)
    again_shared, again_folded = _prepared_bias(bias, mask[:, 3:], 1, 3, torch.float32, prepared)
    assert again_folded is folded and again_shared is shared
    assert torch.equal(folded, _prepared_bias(bias, mask[:, 3:], 1, 3, torch.float32, None)[1])  # same mask union
    other = bias.clone()
    assert _prepared_bias(other, mask[:, 3:], 1, 3, torch.float32, prepared)[1] is not folded
    with torch.inference_mode():  # as the executor folds: inference tensors carry no version counter
        bias = bias.clone()
        assert _prepared_bias(bias, mask, 1, 6, torch.float32, {})[1].shape == folded.shape


# (name, rows, tokens, head dim, compute dtype, block config): the gate fused into the kernel's store.
GATED_CASES = [
    ("gated_fp32_d32_small_blocks", 3, 40, 32, torch.float32, (16, 16, 4, 2)),
    ("gated_bf16_d16_default_blocks", 4, 40, 16, torch.bfloat16, None),
]


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
def test_gated_flash_kernel_matches_the_gated_reference_under_the_triton_interpreter(tmp_path):
    """The gated output (sigmoid(gate) * attention, in the gate's (B, I, J, H*D) layout) equals
    gated_triangle_attention's on the same values; the gate is a strided view of the projection."""
    cases, expected, valid = [], {}, {}
    for index, (name, rows, tokens, head_dim, dtype, config) in enumerate(GATED_CASES):
        *exact, gate = model_inputs(1, rows, tokens, head_dim, seed=200 + index, row_offset=1, with_gate=True)
        *low, low_gate = model_inputs(1, rows, tokens, head_dim, seed=200 + index, dtype=dtype, row_offset=1, with_gate=True)
        assert low_gate.stride(-2) == 4 * HEADS * head_dim  # a view of the projection, not a copy
        scale = head_dim**-0.5
        expected[name] = gated_triangle_attention(*exact, scale, gate, None)
        valid[name] = valid_rows(exact[-1])
        cases.append({"name": name, "inputs": low, "scale": scale, "dtype": str(dtype), "config": config,
                      "group_queries": 1024, "via": "kernel", "gate": low_gate})  # fmt: skip
    outputs = run_interpreted(__file__, cases, tmp_path)
    for name, rows, tokens, head_dim, dtype, _ in GATED_CASES:
        out = outputs[name]
        assert out.shape == (1, rows, tokens, HEADS * head_dim) and out.dtype == dtype, name
        assert torch.isfinite(out).all(), name
        error = relative_error(out[:, valid[name]], expected[name][:, valid[name]])
        assert error <= (FP32_TOL if dtype == torch.float32 else BF16_TOL), (name, error)


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
def test_every_block_config_compiles_for_sm90_within_shared_memory():
    """Ahead-of-time compilation for sm_90 (no GPU needed), specialised as at run time for the model's
    layout (16-divisible pointers and strides, 8-aligned key counts): each autotuning candidate must
    build and fit in shared memory, else it could never launch on an H100/H200."""
    from foldmill.kernels.triangle_attention.triton_kernel import NARROW_CONFIGS, WIDE_CONFIGS, _attention_kernel

    names = _attention_kernel.arg_names
    pointers = {name: "*bf16" for name in names if name.endswith("_ptr")}
    scalars = {name: "i32" for name in names if name not in pointers and not name.isupper()} | {"scale": "fp32"}
    divisible = [name for name in names if name in pointers or "stride" in name]
    for head_dim, configs, gated in ((32, NARROW_CONFIGS, False), (32, NARROW_CONFIGS, True), (64, WIDE_CONFIGS, False)):
        for config in configs:
            constants = {"HEADS": HEADS, "HEAD_DIM": head_dim, "BLOCK_M": config.block_m, "BLOCK_N": config.block_n}
            constants |= {"GROUP_QUERIES": 1024, "ALIGN": 8, "GATED": gated, "DOT_PRECISION": "tf32"}
            constants |= {"EMULATE_BF16": False}
            compiled = sm90_compiled(
                _attention_kernel, {**pointers, **scalars}, constants, config.num_warps, config.num_stages,
                config.max_registers, divisible,
            )  # fmt: skip
            assert compiled.metadata.shared <= H100_SHARED_MEMORY_BYTES, (head_dim, gated, config, compiled.metadata.shared)
            if config.max_registers is not None:  # the cap reached ptxas
                assert f".maxnreg {config.max_registers}" in compiled.asm["ptx"], config


def _run_case(case: dict, dtype: torch.dtype) -> torch.Tensor:
    """Child process (TRITON_INTERPRET=1): one case through the kernel or the backend."""
    from foldmill.kernels.triangle_attention.triton_kernel import BlockConfig, flash_triangle_attention

    q, k, v, bias, mask = case["inputs"]
    if case["via"] == "backend":
        return through_backend("triangle_attention", dtype, q, k, v, bias, mask, case["scale"])
    config = None if case["config"] is None else BlockConfig(*case["config"])
    return flash_triangle_attention(
        q, k, v, bias, mask, case["scale"], dtype, config, case["group_queries"], gate=case.get("gate")
    )


# ---- GPU (run on the H200; skipped without CUDA by conftest's gpu marker) ----


def _needs_triton() -> None:
    if not triton_support.available():
        pytest.skip("triton not installed")


@pytest.mark.gpu
@pytest.mark.parametrize("token_mask", [False, True])
@pytest.mark.parametrize("tokens", [128, 384, 1000])
def test_flash_kernel_gpu_parity_in_bf16(tokens, token_mask):
    """bf16 kernel vs the fp32 reference on the same inputs: a chunk of rows (strided views at a row
    offset, as with chunk_size), the model's permuted bias, masked keys and a fully masked row; with
    token_mask, the model's pair mask (the folded path, and the per-row one for its padding rows)."""
    _needs_triton()
    rows = 24
    q, k, v, bias, mask = model_inputs(
        1, rows, tokens, 32, seed=tokens, device="cuda", row_offset=2, token_mask=token_mask
    )
    expected = triangle_attention(q, k, v, bias, mask, 32**-0.5)
    low = model_inputs(
        1, rows, tokens, 32, seed=tokens, device="cuda", dtype=torch.bfloat16, row_offset=2, token_mask=token_mask
    )
    assert low[0].stride() == q.stride() and not q.is_contiguous()  # strided views of the projection
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        out = kernels.call_backend("triangle_attention", "triton", *low, 32**-0.5)
    assert out.shape == expected.shape and out.dtype == torch.bfloat16
    assert torch.isfinite(out).all()
    keep = valid_rows(mask)
    assert relative_error(out[:, keep], expected[:, keep]) <= BF16_TOL


@pytest.mark.gpu
@pytest.mark.parametrize("token_mask", [False, True])
@pytest.mark.parametrize("tokens", [136, 1000])
def test_gated_flash_kernel_gpu_parity_in_bf16(tokens, token_mask):
    """The fused-gate backend (what GatedAttention runs on the GPU) vs the fp32 gated reference."""
    _needs_triton()
    *exact, gate = model_inputs(1, 24, tokens, 32, seed=tokens, device="cuda", row_offset=2, with_gate=True,
                                token_mask=token_mask)  # fmt: skip
    expected = gated_triangle_attention(*exact, 32**-0.5, gate, None)
    *low, low_gate = model_inputs(1, 24, tokens, 32, seed=tokens, device="cuda", dtype=torch.bfloat16, row_offset=2,
                                  with_gate=True, token_mask=token_mask)  # fmt: skip
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        out = kernels.call_backend("gated_triangle_attention", "triton", *low, 32**-0.5, low_gate, 128)
    assert out.shape == expected.shape and out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    keep = valid_rows(exact[-1])
    assert relative_error(out[:, keep], expected[:, keep]) <= BF16_TOL


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", [16, 32, 64])
def test_flash_kernel_every_block_config_on_gpu(head_dim, dtype):
    """Each autotuning candidate (and the autotuned launch) is right, for every supported head dim and
    half dtype (fp16: masked keys get fp16's lowest value, the fully masked row stays finite)."""
    _needs_triton()
    from foldmill.kernels.triangle_attention.triton_kernel import candidates, flash_triangle_attention

    q, k, v, bias, mask = model_inputs(1, 7, 200, head_dim, seed=head_dim, device="cuda")
    expected = triangle_attention(q, k, v, bias, mask, head_dim**-0.5)
    keep = valid_rows(mask)
    low = model_inputs(1, 7, 200, head_dim, seed=head_dim, device="cuda", dtype=dtype)
    for config in (*candidates(head_dim), None):
        out = flash_triangle_attention(*low, head_dim**-0.5, dtype, config)
        assert out.dtype == dtype and torch.isfinite(out).all(), config
        assert relative_error(out[:, keep], expected[:, keep]) <= BF16_TOL, (head_dim, config)


@pytest.mark.gpu
def test_flash_kernel_replays_in_a_cuda_graph():
    """The first (eager) call tunes; capture and replay then launch the tuned kernel."""
    _needs_triton()
    q, k, v, bias, mask = model_inputs(1, 16, 136, 32, seed=7, device="cuda", dtype=torch.bfloat16)
    other_q = torch.randn_like(q)
    with torch.no_grad():
        expected = kernels.call_backend("triangle_attention", "triton", other_q, k, v, bias, mask, 32**-0.5)  # tunes
        static_q = q.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            kernels.call_backend("triangle_attention", "triton", static_q, k, v, bias, mask, 32**-0.5)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = kernels.call_backend("triangle_attention", "triton", static_q, k, v, bias, mask, 32**-0.5)
        static_q.copy_(other_q)
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_out, expected)


if __name__ == "__main__":
    serve_cases(_run_case, patch_numpy=True)
