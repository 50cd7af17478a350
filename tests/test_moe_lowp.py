"""8-bit expert GEMMs on CPU (emulation): FP8 weight gradients, MXFP8 round trips, the weight cache,
the MXFP8 route per compute capability, and the benchmark's MFU columns."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from foldmill.moe.experts.fp8_rowwise import Fp8RowwiseGemm
from foldmill.moe.experts.mxfp8 import MXFP8Gemm, along_rows_values, round_trip, route_for_capability
from foldmill.moe.experts.weights import WeightCache
from foldmill.moe.quant.fp8 import quantize_group_columns, quantize_weight_columns
from foldmill.moe.quant.mx import quantize_mx
from kernel_testing import HAS_TRITON
from test_moe_quant import adversarial


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    return float((got - want).norm() / want.norm())


@pytest.mark.parametrize(
    ("capability", "route"),
    [(None, "emulated"), ((8, 0), "exact_bf16"), ((9, 0), "exact_bf16"), ((10, 0), "block_scaled"),
     ((12, 0), "block_scaled")],
)
def test_mxfp8_route_per_compute_capability(capability, route):
    assert route_for_capability(capability) == route


@pytest.mark.parametrize("optimizer_options", [{}, {"foreach": True}, {"fused": True}])
def test_weight_cache_serves_a_copy_until_the_weight_changes(optimizer_options):
    weight = torch.nn.Parameter(torch.randn(4, 8))
    cache = WeightCache()
    calls = []

    def make(tensor):
        calls.append(1)
        return tensor.detach().clone()

    first = cache.get("forward", weight, make)
    assert cache.get("forward", weight, make) is first and len(calls) == 1
    weight.grad = torch.randn(4, 8)
    # The fused optimizer updates in place without bumping the version counter.
    torch.optim.AdamW([weight], lr=0.1, **optimizer_options).step()
    refreshed = cache.get("forward", weight, make)
    assert len(calls) == 2 and not torch.equal(refreshed, first) and torch.equal(refreshed, weight.detach())
    # A different tensor with the same values is another weight; old entries go beyond the capacity.
    others = [weight.detach().clone() for _ in range(6)]
    for other in others:
        cache.get("forward", other, make)
    assert len(cache) == cache.capacity
    # Entries hold their weights weakly: a weight its caller dropped takes its copy with it.
    del others, other
    assert len(cache) == 0


def grouped_rows(sizes: list[int], cols: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows in groups of very different magnitudes (so a wrong group's scale shows), with group ends."""
    blocks = [torch.randn(size, cols, generator=generator) * 10.0 ** (group - 2) for group, size in enumerate(sizes)]
    ends = torch.tensor(sizes).cumsum(0).to(torch.int32)
    return torch.cat(blocks), ends


def test_fp8_group_column_scales_factor_out_of_the_weight_gradient():
    generator = torch.Generator().manual_seed(0)
    dy, ends = grouped_rows([32, 0, 48, 16], 24, generator)
    x = torch.randn(dy.shape[0], 40, generator=generator)
    gemm = Fp8RowwiseGemm(fast_accumulation=True)
    got = gemm.wgrad(quantize_group_columns(dy, ends), quantize_group_columns(x, ends), ends, dy.dtype)
    want = F.grouped_mm(dy.t().contiguous(), x, offs=ends)
    assert torch.count_nonzero(got[1]) == 0  # the empty group's gradient
    for group in (0, 2, 3):
        assert relative(got[group], want[group]) < 0.08
    data, scales = quantize_group_columns(dy, ends)
    assert data.shape == (24, dy.shape[0]) and scales.shape == (4 * 24,)
    # Each group's largest element per column lands on the E4M3 maximum.
    assert torch.equal(data.float().abs().amax(dim=1), torch.full((24,), 448.0))


def test_nonempty_groups_give_an_unchosen_expert_one_block_of_zero_rows():
    from foldmill.moe.experts.routing import plan_routing

    experts = torch.tensor([[0, 2], [2, 0], [0, 2]])  # expert 1 and 3 get no token
    plan = plan_routing(experts, 4, 16, nonempty_groups=True)
    sizes = torch.diff(plan.group_ends.long(), prepend=torch.zeros(1, dtype=torch.long))
    assert sizes.tolist() == [16, 16, 16, 16] and plan.rows >= int(plan.group_ends[-1])
    assert torch.all(plan.source_slots[16:32] == -1) and torch.all(plan.source_slots[48:64] == -1)
    assert plan_routing(experts, 4, 16).group_ends.tolist() == [16, 16, 32, 32]


def test_fp8_dgrad_weight_copy_scales_over_the_contraction():
    weight = torch.randn(3, 64, 32) * torch.linspace(0.01, 10, 32)
    data, scales = quantize_weight_columns(weight)
    assert data.shape == (3, 32, 64) and scales.shape == (3, 32)
    values = data.float() * scales.unsqueeze(-1)
    assert relative(values, weight.transpose(-2, -1)) < 0.04


def test_fp8_backend_quantizes_each_weight_once_per_version():
    gemm = Fp8RowwiseGemm(fast_accumulation=True)
    weight = torch.nn.Parameter(torch.randn(2, 32, 64) * 0.1)
    x = torch.randn(64, 64)
    ends = torch.tensor([32, 64], dtype=torch.int32)
    y, saved = gemm.forward(x, weight, ends)
    first = gemm.weights.get("copies", weight, lambda t: pytest.fail("weight was quantized again"))
    gemm.forward(x, weight, ends)
    assert gemm.weights.get("copies", weight, lambda t: pytest.fail("weight was quantized again")) is first
    assert relative(y, F.grouped_mm(x, weight.detach().transpose(-2, -1), offs=ends)) < 0.06
    assert saved[0].dtype == torch.float8_e4m3fn  # x is kept for wgrad in 8 bits, not in fp32


def test_mxfp8_round_trip_gives_the_exact_values_of_both_block_directions():
    generator = torch.Generator().manual_seed(2)
    x = adversarial(64, 96, generator)
    by_cols, by_rows, kept = round_trip(x, along_cols=True, along_rows=True, keep_along_rows=True)
    assert torch.equal(by_cols.nan_to_num(7.0), quantize_mx(x).dequantize().nan_to_num(7.0))
    want_rows = quantize_mx(x.t()).dequantize().t()
    assert torch.equal(by_rows.nan_to_num(7.0), want_rows.nan_to_num(7.0))
    assert kept.data.dtype == torch.float8_e4m3fn and kept.scale.shape == (96, 2)
    assert torch.equal(along_rows_values(kept).nan_to_num(7.0), want_rows.nan_to_num(7.0))


def test_mxfp8_backend_gradients_equal_the_dequantized_products():
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(96, 64, generator=generator)
    w = torch.randn(3, 32, 64, generator=generator)
    dy = torch.randn(96, 32, generator=generator)
    ends = torch.tensor([32, 32, 96], dtype=torch.int32)
    gemm = MXFP8Gemm()
    y, saved = gemm.forward(x, w, ends)
    dx, dw = gemm.backward(dy, w, saved, ends)
    q = lambda t: quantize_mx(t).dequantize()  # noqa: E731 - blocks along the last dimension
    assert torch.allclose(y, F.grouped_mm(q(x), q(w).transpose(-2, -1), offs=ends), rtol=1e-5, atol=1e-5)
    assert torch.allclose(dx, F.grouped_mm(q(dy), q(w.transpose(-2, -1)).transpose(-2, -1), offs=ends),
                          rtol=1e-5, atol=1e-5)
    assert torch.allclose(dw, F.grouped_mm(q(dy.t()), q(x.t()).t(), offs=ends), rtol=1e-5, atol=1e-5)
    assert torch.count_nonzero(dw[1]) == 0


def _stored_input_case(seed: int):
    """An expert MLP's operands on CPU: 3 experts (one with no rows), hidden 64, FFN 96."""
    generator = torch.Generator().manual_seed(seed)
    ends = torch.tensor([64, 64, 160], dtype=torch.int32)
    x = torch.randn(160, 64, generator=generator)
    probs = torch.rand(160, generator=generator)
    w13 = torch.randn(3, 192, 64, generator=generator) / 8
    w2 = torch.randn(3, 64, 96, generator=generator) / 10
    grad_y = torch.randn(160, 64, generator=generator)
    return x, probs, w13, w2, ends, grad_y


def _experts_and_gradients(gemm, x, probs, w13, w2, ends, grad_y, inspect=lambda node: None):
    """(output, gradients of x, probs, w13, w2); `inspect` sees the autograd node before the backward."""
    from foldmill.moe.experts.mlp import grouped_swiglu_experts

    leaves = [t.clone().requires_grad_() for t in (x, probs, w13, w2)]
    y = grouped_swiglu_experts(*leaves, ends, gemm)
    inspect(y.grad_fn)
    y.backward(grad_y)
    assert y.grad_fn.h_saved is None and y.grad_fn.a_saved is None  # dropped once the backward has run
    return y.detach(), [leaf.grad for leaf in leaves]


def test_mxfp8_stored_swiglu_input_keeps_only_its_copy_and_takes_the_gradient_there():
    """With store_swiglu_input the forward pass is unchanged, the backward keeps h only as its MXFP8
    copy (no a), and every gradient is the MXFP8 backend's computed with h's copy in place of h:
    written out here from the format's own steps."""
    from foldmill.moe.experts.mxfp8 import StoredSwiGLUInput
    from foldmill.moe.experts.swiglu import swiglu_backward, swiglu_forward

    def kept_only_the_copy(node):
        assert isinstance(node.h_saved, StoredSwiGLUInput) and node.a_saved is node.h_saved
        assert node.h_saved.h.data.dtype == torch.float8_e4m3fn and node.h_saved.h.data.shape == (160, 192)

    x, probs, w13, w2, ends, grad_y = _stored_input_case(4)
    y_plain, grads_plain = _experts_and_gradients(MXFP8Gemm(), x, probs, w13, w2, ends, grad_y)
    y, grads = _experts_and_gradients(MXFP8Gemm(store_swiglu_input=True), x, probs, w13, w2, ends, grad_y,
                                      kept_only_the_copy)
    assert torch.equal(y, y_plain)

    cols = lambda t: quantize_mx(t).dequantize()  # blocks along the last dimension
    rows = lambda t: quantize_mx(t.transpose(-2, -1)).dequantize().transpose(-2, -1)  # blocks along the rows
    h = F.grouped_mm(cols(x), cols(w13).transpose(-2, -1), offs=ends)
    h_copy = cols(h)
    grad_a = F.grouped_mm(cols(grad_y), rows(w2), offs=ends)
    grad_w2 = F.grouped_mm(rows(grad_y).t(), rows(swiglu_forward(h_copy, probs)), offs=ends)
    grad_h, grad_probs = swiglu_backward(h_copy, probs, grad_a)
    grad_x = F.grouped_mm(cols(grad_h), rows(w13), offs=ends)
    grad_w13 = F.grouped_mm(rows(grad_h).t(), rows(x), offs=ends)
    for name, got, want in zip(("x", "probs", "w13", "w2"), grads, (grad_x, grad_probs, grad_w13, grad_w2)):
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-6), name
    # The copy really is what the gradients were taken at: h itself gives other gradients.
    assert not torch.allclose(grads[2], grads_plain[2], rtol=1e-4, atol=0)


def test_mxfp8_stored_swiglu_input_on_the_block_scaled_route_gives_the_emulated_gradients(monkeypatch):
    """Blackwell's route (quantize, then block-scaled GEMMs; here their torch fallbacks on CPU) keeps
    the same copy of h and gives the same gradients as the emulation."""
    from foldmill.moe.experts import mxfp8

    case = _stored_input_case(5)
    y_emulated, grads_emulated = _experts_and_gradients(MXFP8Gemm(store_swiglu_input=True), *case)
    monkeypatch.setattr(mxfp8, "gemm_route", lambda tensor: "block_scaled")
    y, grads = _experts_and_gradients(MXFP8Gemm(store_swiglu_input=True), *case)
    assert torch.allclose(y, y_emulated, rtol=1e-5, atol=1e-6)
    for name, got, want in zip(("x", "probs", "w13", "w2"), grads, grads_emulated):
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-6), name


@pytest.mark.parametrize("route", ["emulated", "block_scaled"])
@pytest.mark.parametrize("store_swiglu_input", [False, True])
def test_mxfp8_weight_copies_made_per_gemm_give_the_kept_copies_values(monkeypatch, route, store_swiglu_input):
    """Without keep_weight_copies every GEMM makes the one copy of its weight it needs and nothing is
    kept for the step, and the output and every gradient are the same bits as with the kept copies."""
    from foldmill.moe.experts import mxfp8

    if route == "block_scaled":  # Blackwell's route, here its torch fallbacks on CPU
        monkeypatch.setattr(mxfp8, "gemm_route", lambda tensor: "block_scaled")
    made = []
    round_trip = mxfp8.round_trip
    monkeypatch.setattr(mxfp8, "round_trip", lambda values, *args, **kwargs: made.append(tuple(values.shape))
                        or round_trip(values, *args, **kwargs))
    case = _stored_input_case(6)
    weights = [tuple(case[2].shape), tuple(case[3].shape)]
    made_for_weights = lambda: sorted(shape for shape in made if shape in weights)
    y_kept, grads_kept = _experts_and_gradients(MXFP8Gemm(store_swiglu_input=store_swiglu_input), *case)
    if route == "emulated":  # both layouts of each weight from one call, for forward and backward
        assert made_for_weights() == sorted(weights)
    made.clear()
    per_gemm = MXFP8Gemm(store_swiglu_input=store_swiglu_input, keep_weight_copies=False)
    y, grads = _experts_and_gradients(per_gemm, *case)
    assert per_gemm.weights is None
    if route == "emulated":  # one layout in each of the weight's two GEMMs
        assert made_for_weights() == sorted(weights * 2)
    assert torch.equal(y, y_kept)
    for name, got, want in zip(("x", "probs", "w13", "w2"), grads, grads_kept):
        assert torch.equal(got, want), name


def test_fp8_weight_copies_made_per_gemm_give_the_kept_copies_values(monkeypatch):
    """The FP8 backend without keep_weight_copies makes the row-wise copy in the forward GEMM and the
    per-(expert, k) copy in dgrad, and gives the same bits as with both copies kept."""
    from foldmill.moe.experts import fp8_rowwise

    made = []
    for name in ("quantize_rowwise", "quantize_weight_columns", "quantize_weight_copies"):
        monkeypatch.setattr(fp8_rowwise, name, lambda w, name=name, make=getattr(fp8_rowwise, name):
                            made.append(name) or make(w))
    x, probs, w13, w2, ends, grad_y = _stored_input_case(7)  # groups start on 16-row multiples
    kept = _experts_and_gradients(Fp8RowwiseGemm(fast_accumulation=True), x, probs, w13, w2, ends, grad_y)
    assert made == ["quantize_weight_copies"] * 2  # w13 and w2, once each
    made.clear()
    per_gemm = _experts_and_gradients(Fp8RowwiseGemm(fast_accumulation=True, keep_weight_copies=False),
                                      x, probs, w13, w2, ends, grad_y)
    assert sorted(made) == ["quantize_rowwise"] * 2 + ["quantize_weight_columns"] * 2
    assert torch.equal(per_gemm[0], kept[0])
    for name, got, want in zip(("x", "probs", "w13", "w2"), per_gemm[1], kept[1]):
        assert torch.equal(got, want), name


def test_bench_mfu_columns_hold_each_precision_against_its_own_peak():
    from foldmill.bench.moe import add_mfu, markdown_table
    from foldmill.moe.train.metrics import spec_peaks

    spec = spec_peaks("NVIDIA H200")
    bf16 = {"variant": "foldmill grouped", "tflops": 494.5}
    fp8 = {"variant": "foldmill fp8_rowwise", "tflops": 989.5}
    add_mfu(bf16, "bf16", {"bf16": 790.0, "fp8": 1280.0}, spec)
    add_mfu(fp8, "fp8", {"bf16": 790.0, "fp8": 1280.0}, spec)
    assert bf16["mfu_spec"] == 0.5 and bf16["mfu_measured"] == round(494.5 / 790, 3)
    assert fp8["mfu_spec"] == 0.5 and fp8["mfu_bf16_spec"] == 1.001 and fp8["mfu_measured"] == round(989.5 / 1280, 3)
    table = markdown_table([bf16, fp8])
    header = table.splitlines()[0]
    assert header.startswith("| variant | tflops | precision | mfu_spec | mfu_bf16_spec | mfu_measured |")
    # A GPU without FP8 tensor cores, and one whose peaks are not known: no column against a made-up peak.
    on_a100 = {"variant": "foldmill fp8_rowwise", "tflops": 156.0}
    add_mfu(on_a100, "fp8", {}, spec_peaks("NVIDIA A100-SXM4-80GB"))
    assert on_a100 == {"variant": "foldmill fp8_rowwise", "tflops": 156.0, "precision": "fp8", "mfu_bf16_spec": 0.5}
    unknown = {"variant": "foldmill grouped", "tflops": 100.0}
    add_mfu(unknown, "bf16", {"bf16": 200.0}, spec_peaks("NVIDIA L40S"))
    assert unknown == {"variant": "foldmill grouped", "tflops": 100.0, "precision": "bf16", "mfu_measured": 0.5}



def test_bench_row_that_runs_out_of_memory_is_one_line_and_other_failures_keep_their_traceback(capsys):
    """A row too big for the GPU is an answer about that GPU: its printed row names the error, with
    no traceback; another failure prints its traceback as well. The rows after either still run."""
    import json

    from foldmill.bench.moe import _guarded

    def out_of_memory() -> dict:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.51 GiB.\nIncluding non-PyTorch memory")

    def refused() -> dict:
        raise RuntimeError("CUDNN_STATUS_BAD_PARAM")

    results: list[dict] = []
    _guarded(results, {"variant": "too big"}, out_of_memory)
    printed = capsys.readouterr()
    assert "Traceback" not in printed.err + printed.out
    assert json.loads(printed.out) == {"variant": "too big",
                                       "error": "OutOfMemoryError: CUDA out of memory. Tried to allocate 3.51 GiB."}
    _guarded(results, {"variant": "refused"}, refused)
    printed = capsys.readouterr()
    assert "Traceback" in printed.err and "in refused" in printed.err
    assert json.loads(printed.out)["error"] == "RuntimeError: CUDNN_STATUS_BAD_PARAM"
    _guarded(results, {"variant": "fits"}, lambda: {"ms": 1.0})
    assert [row.get("error", row.get("ms")) for row in results] == [
        "OutOfMemoryError: CUDA out of memory. Tried to allocate 3.51 GiB.", "RuntimeError: CUDNN_STATUS_BAD_PARAM", 1.0]


def test_bench_moe_kernel_cases_run_and_count_their_bytes():
    """The kernels section's cases run (here through the torch paths the CPU takes) and count the
    bytes of what they read and write: a bf16 copy reads and writes x; the SwiGLU that writes MXFP8
    copies moves more than the plain one, by its copies' bytes."""
    from foldmill.bench._moe_kernels import kernel_cases, kernel_shape
    from foldmill.moe.config import model_config

    config = model_config("tiny")
    tokens = 64
    cases = kernel_cases(config, tokens, device="cpu")
    rows, hidden, ffn = tokens * config.top_k, config.hidden_size, config.ffn_size
    by_name = {case.variant: case for case in cases}
    assert len(by_name) == len(cases) == 14
    assert by_name["bf16 copy of x (memory-speed reference)"].bytes_moved == 2 * 2 * rows * hidden
    plain, mx = by_name["SwiGLU forward"], by_name["SwiGLU forward writing MXFP8 copies"]
    assert mx.bytes_moved - plain.bytes_moved == rows * ffn + rows * ffn // 32  # the kept copy and its scales
    # Storing h's copy instead of a's along-rows copy writes twice the elements: h is 2F wide.
    stored = by_name["SwiGLU forward writing a's copy along F and h's MXFP8 copy (moe.mxfp8_store_swiglu_input)"]
    assert stored.bytes_moved - mx.bytes_moved == rows * ffn + rows * ffn // 32
    for case in cases:
        assert case.run() is not None, case.variant
    assert kernel_shape("tiny", config, tokens) == f"tiny: {rows} expert rows, hidden {hidden}, FFN {ffn}"


def test_bench_moe_refuses_unknown_sections_in_one_line(capsys, monkeypatch):
    """A misspelt --sections name or model config, a token count the kernels section cannot split,
    or the quack-tiles section without QuACK stops the bench before any GPU work in one line,
    naming what is valid."""
    from foldmill.bench import moe
    from foldmill.bench._standalone import main
    from foldmill.bench.moe import parse_sections, register

    assert parse_sections("gemm,profile,kernels") == {"gemm", "profile", "kernels"}
    assert main(register, ["--sections", "step,profle"]) == 2
    error = capsys.readouterr().err
    assert error == ("error: --sections 'step,profle': unknown profle; choose from gemm, layer, step, attention, "
                     "profile, host, kernels, quack-tiles\n")
    monkeypatch.setattr(moe, "quack_installed", lambda: False)
    assert main(register, ["--sections", "step,quack-tiles"]) == 2
    assert capsys.readouterr().err == "error: --sections quack-tiles needs QuACK: pip install quack-kernels\n"
    assert main(register, ["--sections", ","]) == 2
    assert "no section named; choose from" in capsys.readouterr().err
    assert main(register, ["--wide-step-model", "mixtral_8x7b"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: unknown model config 'mixtral_8x7b'; choose one of ") and error.count("\n") == 1
    assert main(register, ["--layer-shapes", "bio_8x1b,mixtral"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: unknown model config 'mixtral'; choose one of ") and error.count("\n") == 1
    assert main(register, ["--sections", "kernels", "--tokens", "100"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: --tokens 100: the kernels section splits bio_8x1b's 200 expert rows ")
    assert error.endswith("a positive multiple of 256\n") and error.count("\n") == 1


def test_bench_skips_contenders_that_do_not_import(tmp_path, monkeypatch):
    """A contender library that is missing, or installed but failing to import (an extension built for
    another torch), is skipped instead of ending the bench; one that imports is used."""
    import math

    from foldmill.bench.moe import _optional

    (tmp_path / "broken_contender.py").write_text("raise OSError('libnccl.so.2: cannot open shared object file')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _optional("broken_contender", "gemm") is None
    assert _optional("no_such_contender_library", "gemm") is None
    assert _optional("math", "sqrt") is math.sqrt


def test_bench_profile_sorts_kernels_into_categories():
    """Kernel names as the torch profiler reports them on the H200 land in their categories, and
    every Triton kernel of the quantizer modules counts as an 8-bit copy."""
    from foldmill.bench.moe import KERNEL_CATEGORIES, OTHER_KERNELS, kernel_category

    names = {
        "_ZN7cutlass13device_kernelIN2at4cuda6detail25enable_3x_kernel_for_sm9xINS_4gemm6kernel13GemmUniversalINS5_"
        "17GroupProblemShapeIN4cute5tupleIJiiiEEEEE": "grouped expert GEMMs",
        "_cast_kernel": "8-bit copies",
        "_tile_maxima_kernel": "8-bit copies",
        "_swiglu_backward_kernel": "SwiGLU",
        "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x128_1x4x1_cga1x1x1_kernel0_0":
            "attention",
        "void cudnn::fusion::compute_dot_do_o_specialized<true, 128>(void const*)": "attention",
        "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT": "dense GEMMs (projections, router, logits)",
        "sm80_xmma_gemm_f32f32_f32f32_f32_nt_n_tilesize32x32x8_stage3_warpsize1x2x1_ffma_aligna4_alignc4":
            "dense GEMMs (projections, router, logits)",
        "_adamw_kernel": "AdamW",
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::TensorListMetadata<1>>":
            "gradient norm",
        "_sum_of_squares_kernel": "gradient norm",
        "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float, true>": "norms",
        "_add_rms_norm_backward_kernel": "norms",
        "_upcast_kernel": "casts and copies",
        "void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda(at::Tensor"
        "IteratorBase&)::{lambda(float)#1}": "casts and copies",
        "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIterator"
        "Base&)::{lambda()#3}": "casts and copies",
        "_permute_kernel": OTHER_KERNELS,
        "Memset (Device)": OTHER_KERNELS,
    }
    assert {name: kernel_category(name) for name in names} == names

    from kernel_testing import HAS_TRITON

    if not HAS_TRITON:
        return
    import importlib

    from triton.runtime.jit import JITFunction

    copies = dict(KERNEL_CATEGORIES)["8-bit copies"]
    for module in ("foldmill.moe.kernels.fp8_quant", "foldmill.moe.kernels.mx_quant"):
        kernels = [name for name, value in vars(importlib.import_module(module)).items()
                   if isinstance(value, JITFunction) and name.endswith("_kernel")]
        assert kernels and all(name in copies for name in kernels), (module, kernels)


def test_bench_profile_totals_are_the_sums_of_its_kernels():
    from foldmill.bench.moe import KERNEL_CATEGORIES, OTHER_KERNELS, kernel_category, ms_by_category

    kernels = [{"kernel": name, "category": kernel_category(name), "ms": ms, "launches_per_step": 16.0}
               for name, ms in (("_cast_kernel", 13.25), ("_tile_maxima_kernel", 5.5), ("_adamw_kernel", 16.0),
                                ("_permute_kernel", 1.25))]
    totals = ms_by_category(kernels)
    assert totals["8-bit copies"] == 18.75 and totals["AdamW"] == 16.0 and totals[OTHER_KERNELS] == 1.25
    assert totals["all kernels"] == 36.0
    assert set(totals) == {"all kernels", OTHER_KERNELS, *(category for category, _ in KERNEL_CATEGORIES)}


if HAS_TRITON:  # the tile shapes the MXFP8 GEMMs' autotuner tries
    from foldmill.moe.kernels.mx_grouped_gemm import CONFIGS as MX_GEMM_CONFIGS
else:
    MX_GEMM_CONFIGS = []
COMPILE_CASES = {
    # kernel name: (module, pointer dtypes, integer arguments, constants[, other typed arguments[, (warps, stages)]])
    # The combinations of outputs the MXFP8 backend asks for, with the warps mx_round_trip_triton
    # launches them with (mx_quant._BOTH_WAYS_*, _INPUT_* and _ALL_THREE_* block columns and warps).
    **{
        f"_dual_kernel[{name}]": (
            "foldmill.moe.kernels.mx_quant",
            {"x_ptr": "*bf16", "by_cols_ptr": "*bf16", "by_rows_ptr": "*bf16", "mx_data_ptr": "*fp8e4nv",
             "mx_scale_ptr": "*u8"},
            ("rows", "cols", "stride_xb", "stride_xr", "stride_xc"),
            {"ALONG_COLS_VALUES": along_cols, "ALONG_ROWS_VALUES": along_rows, "ALONG_ROWS_MX": keep,
             "BLOCK_C": block_c},
            None,
            (warps, 3),
        )
        for name, along_cols, along_rows, keep, block_c, warps in [
            ("weights and dy", True, True, False, 128, 4),
            ("x and a", True, False, True, 64, 2),
            ("all three", True, True, True, 64, 4),
            # moe.keep_weight_copies: false, one layout per GEMM
            ("weight along K", True, False, False, 64, 2),
            ("weight along N", False, True, False, 128, 4),
        ]
    },
    # The SwiGLU kernels, plain and writing the MXFP8 backend's copies (kernels/swiglu.py launches):
    # a's copies, or a's values and h's copy (store_swiglu_input), or a's along-rows values from h's copy.
    **{
        f"_swiglu_forward_kernel[{name}]": (
            "foldmill.moe.kernels.swiglu",
            {"h_ptr": "*fp8e4nv" if h_mx else "*bf16", "h_scale_ptr": "*u8", "p_ptr": "*fp32", "a_ptr": "*bf16",
             "by_rows_ptr": "*bf16", "data_ptr": "*fp8e4nv", "scale_ptr": "*u8", "h_data_ptr": "*fp8e4nv",
             "h_scales_ptr": "*u8"},
            ("rows", "ffn"),
            {"H_MX": h_mx, "ALONG_COLS_VALUES": cols, "ALONG_ROWS_VALUES": rows, "ALONG_ROWS_MX": rows_mx,
             "STORE_H_MX": store, "BLOCK_R": 32, "BLOCK_F": block_f},
            None,
            (warps, 3),
        )
        for name, h_mx, cols, rows, rows_mx, store, block_f, warps in [
            ("plain", False, False, False, False, False, 128, 4),
            ("mx", False, True, False, True, False, 64, 2),
            ("mx, storing h", False, True, False, False, True, 64, 2),
            ("mx, a along rows from stored h", True, False, True, False, False, 64, 2),
        ]
    },
    "_swiglu_backward_kernel": (
        "foldmill.moe.kernels.swiglu",
        {"h_ptr": "*bf16", "p_ptr": "*fp32", "da_ptr": "*bf16", "dh_ptr": "*bf16", "dp_ptr": "*fp32"},
        ("rows", "ffn"),
        {"BLOCK_R": 16, "BLOCK_F": 128},
    ),
    **{
        f"_swiglu_backward_mx_kernel[{name}]": (
            "foldmill.moe.kernels.swiglu",
            {"h_ptr": "*fp8e4nv" if h_mx else "*bf16", "h_scale_ptr": "*u8", "p_ptr": "*fp32", "da_ptr": "*bf16",
             "by_cols_ptr": "*bf16", "by_rows_ptr": "*bf16", "dp_ptr": "*fp32"},
            ("rows", "ffn"),
            {"H_MX": h_mx, "BLOCK_F": 64},
            None,
            (4, 3),  # swiglu._MX_BACKWARD_BLOCK_F, _MX_BACKWARD_WARPS
        )
        for name, h_mx in [("h", False), ("stored h", True)]
    },
    "_dequantize_rows_kernel": (
        "foldmill.moe.kernels.mx_quant",
        {"data_ptr": "*fp8e4nv", "scale_ptr": "*u8", "out_ptr": "*bf16"},
        ("rows", "cols"),
        {"BLOCK_C": 256},
        None,
        (2, 3),  # mx_quant._DEQUANT_BLOCK_C, _DEQUANT_WARPS
    ),
    "_rope_kernel": (
        "foldmill.moe.kernels.rope",
        {"x_ptr": "*bf16", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "out_ptr": "*bf16"},
        ("seq", "heads", "cos_stride_b"),
        {"SIGN": 1.0, "BLOCK_H": 16, "HALF": 64},
    ),
    # The bf16 model's norms, and bf16-mixed's: a float32 stream taking a bf16 delta.
    **{
        f"_add_rms_norm_forward_kernel[{name}]": (
            "foldmill.moe.kernels.rms_norm",
            {"x_ptr": stream, "delta_ptr": "*bf16", "weight_ptr": stream, "h_ptr": stream, "y_ptr": stream,
             "rstd_ptr": "*fp32"},
            ("cols",),
            {"BLOCK_C": 2048},
            {"eps": "fp32"},
            (8, 3),  # rms_norm._warps(2048)
        )
        for name, stream in [("bf16", "*bf16"), ("float32 stream", "*fp32")]
    },
    **{
        f"_add_rms_norm_backward_kernel[{name}]": (
            "foldmill.moe.kernels.rms_norm",
            {"dy_ptr": stream, "dh_ptr": stream, "h_ptr": stream, "weight_ptr": stream, "rstd_ptr": "*fp32",
             "dx_ptr": stream, "dw_partial_ptr": "*fp32"},
            ("rows", "cols"),
            {"HAS_DH": True, "ROWS": 16, "BLOCK_C": 2048},  # rms_norm._BACKWARD_ROWS
            None,
            (8, 3),
        )
        for name, stream in [("bf16", "*bf16"), ("float32 stream", "*fp32")]
    },
    "_sum_of_squares_kernel": (
        "foldmill.moe.kernels.grad_norm",
        {"addresses_ptr": "*i64", "chunk_starts_ptr": "*i64", "numels_ptr": "*i64", "partials_ptr": "*fp32",
         "first_ptr": "*bf16"},
        ("tensors",),
        {"CHUNK": 65536, "BLOCK": 4096, "TENSORS_BLOCK": 256},  # grad_norm._CHUNK, _BLOCK
        None,
        (8, 3),  # grad_norm._WARPS
    ),
    # The routing plan at 8 experts (routing._TILE // 8 slots per chunk, routing._WARPS).
    "_chunk_counts_kernel": (
        "foldmill.moe.kernels.routing",
        {"index_ptr": "*i64", "chunk_counts_ptr": "*i32"},
        ("slots",),
        {"E_BLOCK": 8, "CHUNK": 1024},
        None,
        (8, 3),
    ),
    "_place_kernel": (
        "foldmill.moe.kernels.routing",
        {"index_ptr": "*i64", "chunk_counts_ptr": "*i32", "counts_ptr": "*i64", "ends_ptr": "*i32",
         "slot_rows_ptr": "*i64", "source_slots_ptr": "*i64"},
        ("slots", "capacity", "chunks", "num_experts", "fill_rows"),
        {"PAD": 16, "NONEMPTY": True, "E_BLOCK": 8, "CHUNK": 1024, "CHUNKS_BLOCK": 64},
        None,
        (8, 3),
    ),
    # The router's top-k softmax at 8 experts, top-2 (router._BLOCK_T, _WARPS).
    "_top_k_softmax_kernel": (
        "foldmill.moe.kernels.router",
        {"logits_ptr": "*fp32", "probs_ptr": "*fp32", "weights_ptr": "*fp32", "experts_ptr": "*i64",
         "partials_ptr": "*fp32"},
        ("tokens", "num_experts"),
        {"TOP_K": 2, "K_BLOCK": 2, "E_BLOCK": 8, "BLOCK_T": 64},
    ),
    "_top_k_softmax_backward_kernel": (
        "foldmill.moe.kernels.router",
        {"probs_ptr": "*fp32", "weights_ptr": "*fp32", "experts_ptr": "*i64", "grad_weights_ptr": "*fp32",
         "grad_sums_ptr": "*fp32", "grad_logits_ptr": "*fp32"},
        ("tokens", "num_experts"),
        {"TOP_K": 2, "K_BLOCK": 2, "E_BLOCK": 8, "BLOCK_T": 64},
    ),
    # The float32 router logits at 8 experts and 8,192 tokens (router_logits._forward_constants,
    # _backward_constants; _WARPS, _BACKWARD_WARPS).
    "_router_logits_kernel": (
        "foldmill.moe.kernels.router_logits",
        {"x_ptr": "*fp32", "w_ptr": "*fp32", "logits_ptr": "*fp32"},
        ("tokens", "hidden", "num_experts"),
        {"E_BLOCK": 8, "BLOCK_T": 16, "BLOCK_K": 64, "STAGES": 4},
        None,
        (4, 3),
    ),
    "_router_logits_backward_kernel": (
        "foldmill.moe.kernels.router_logits",
        {"x_ptr": "*fp32", "w_ptr": "*fp32", "grad_ptr": "*fp32", "dx_ptr": "*fp32", "partial_ptr": "*fp32"},
        ("tokens", "hidden", "num_experts"),
        {"E_BLOCK": 8, "BLOCK_T": 256, "SUB_T": 8, "BLOCK_K": 64},
        None,
        (1, 3),
    ),
    "_upcast_kernel": (
        "foldmill.moe.kernels.cast",
        {"src_ptr": "*bf16", "dst_ptr": "*fp32"},
        ("numel",),
        {"BLOCK": 4096},  # cast._BLOCK, _WARPS
        None,
        (4, 3),
    ),
    # A weight's forward copy alone (moe.keep_weight_copies: false), at the widest BLOCK it launches with.
    "_rowwise_kernel": (
        "foldmill.moe.kernels.fp8_quant",
        {"x_ptr": "*bf16", "data_ptr": "*fp8e4nv", "scale_ptr": "*fp32"},
        ("cols",),
        {"BLOCK": 2048},
        None,
        (4, 3),
    ),
    "_tile_maxima_kernel": (
        "foldmill.moe.kernels.fp8_quant",
        {"x_ptr": "*bf16", "row_partial_ptr": "*fp32", "col_partial_ptr": "*bf16", "ends_ptr": "*i32"},
        ("groups", "rows", "cols", "stride_r"),
        {"SUBS": 4, "SUB": 16, "BLOCK_C": 256},  # fp8_quant._MAXIMA_BLOCK_R // _SUB, _SUB, _MAXIMA_BLOCK_C
        None,
        (4, 3),
    ),
    "_scales_kernel": (
        "foldmill.moe.kernels.fp8_quant",
        {"col_partial_ptr": "*bf16", "row_partial_ptr": "*fp32", "ends_ptr": "*i32", "scale_ptr": "*fp32",
         "row_scale_ptr": "*fp32"},
        ("groups", "rows", "cols", "partials", "col_blocks"),
        # fp8_quant._GROUP_BLOCK_S, _GROUP_BLOCK_C, _SUB, _ROW_BLOCK_P, _ROW_BLOCK_R
        {"ROWWISE": True, "BLOCK_S": 128, "BLOCK_C": 32, "SUB": 16, "BLOCK_P": 8, "BLOCK_R": 256},
    ),
    # Both copies with the transposed one stored by TMA, and the transposed copy alone by pointers.
    **{
        f"_cast_kernel[{name}]": (
            "foldmill.moe.kernels.fp8_quant",
            {"x_ptr": "*bf16", "ends_ptr": "*i32", "scale_ptr": "*fp32", "data_ptr": "*fp8e4nv",
             "row_data_ptr": "*fp8e4nv", "row_scale_ptr": "*fp32"},
            ("groups", "cols", "stride_r", "out_stride_c", "out_group_shift", "group_rows"),
            {"ROWWISE": rowwise, "TMA": tma, "BLOCK_R": 64, "BLOCK_C": 64, "GROUPS": 8,
             **({} if tma else {"data_desc": None})},
            {"data_desc": "tensordesc<fp8e4nv[1, 64, 64]>"} if tma else None,  # _CAST_BLOCK_C, _CAST_BLOCK_R
            (4 if tma else 8, 1),  # _CAST_WARPS, _CAST_POINTER_WARPS
        )
        for name, rowwise, tma in [("both copies, TMA", True, True), ("transposed copy, pointers", False, False)]
    },
    # Token permute with and without the routing weights, and its sum back per token, at the widest
    # BLOCK_H they launch with (permute._block_h).
    **{
        f"_permute_kernel[{name}]": (
            "foldmill.moe.kernels.permute",
            {"src_ptr": "*bf16", "slots_ptr": "*i32", "probs_ptr": "*fp32", "rows_ptr": "*bf16",
             "row_probs_ptr": "*fp32"},
            ("hidden",),
            {"TOP_K": 2, "HAS_PROBS": probs, "BLOCK_H": 1024},
        )
        for name, probs in [("with weights", True), ("rows only", False)]
    },
    "_sum_rows_kernel": (
        "foldmill.moe.kernels.permute",
        {"src_ptr": "*bf16", "index_ptr": "*i32", "out_ptr": "*bf16"},
        ("hidden",),
        {"TOP_K": 2, "BLOCK_H": 1024},
    ),
    # MXFP8 elements and scales along the last dimension (mx_quant.quantize_mx_triton).
    "_quantize_kernel": (
        "foldmill.moe.kernels.mx_quant",
        {"x_ptr": "*bf16", "data_ptr": "*fp8e4nv", "scale_ptr": "*u8"},
        ("rows", "cols", "stride_xb", "stride_xr", "stride_xc"),
        {"BLOCK_R": 32, "BLOCK_C": 128},
    ),
    # The MXFP8 grouped GEMMs in each Hopper MMA mode at every tile shape their autotuner tries.
    **{
        f"{kernel}[{mode} MMA, {m}x{n}, {warps} warps, {stages} stages]": (
            "foldmill.moe.kernels.mx_grouped_gemm",
            {"sa_ptr": "*u8", "sb_ptr": "*u8", "out_ptr": "*bf16", "ends_ptr": "*i32"},
            integers,
            {"MMA_MODE": mode, "BLOCK_M": m, "BLOCK_N": n, "GROUP_M": 8},
            {"a_desc": f"tensordesc<fp8e4nv[{m}, 32]>", "b_desc": f"tensordesc<fp8e4nv[{n}, 32]>"},
            (warps, stages),
        )
        for kernel, integers in [("_grouped_forward_kernel", ("rows_total", "N", "K", "num_experts")),
                                 ("_grouped_wgrad_kernel", ("N", "K"))]
        for mode in ("fp8", "bf16")
        for m, n, warps, stages in MX_GEMM_CONFIGS
    },
    # bf16 parameters; float32 masters of bf16 weights (bf16-mixed, train/precision.py)
    **{
        f"_adamw_kernel[{name}]": (
            "foldmill.moe.kernels.adamw",
            {"param_ptr": values, "grad_ptr": "*bf16", "exp_avg_ptr": values, "exp_avg_sq_ptr": values,
             "step_ptr": "*fp32", "grad_scale_ptr": "*fp32", "rounded_ptr": "*bf16"},
            ("numel",),
            {"BLOCK": 1024, "WRITE_ROUNDED": rounded},  # adamw._BLOCK
            {"lr": "fp32", "beta1": "fp32", "beta2": "fp32", "eps": "fp32", "weight_decay": "fp32"},
        )
        for name, values, rounded in [("bf16", "*bf16", False), ("float32 master", "*fp32", True)]
    },
}


def _compile_case(name: str, capability: int = 90, **constants: object):
    """COMPILE_CASES[name] built ahead of time for `capability` (no GPU needed), with the launch
    options the wrappers use; `constants` replace the case's own."""
    import importlib

    import triton
    from kernel_testing import sm90_compiled

    module, pointers, integers, case_constants, *options = COMPILE_CASES[name]
    typed = options[0] if options else None  # arguments neither pointers nor i32 (floats, tensor descriptors)
    num_warps, num_stages = options[1] if len(options) > 1 else (4, 3)
    kernel = getattr(importlib.import_module(module), name.split("[")[0])
    kernel = kernel.fn if isinstance(kernel, triton.runtime.Autotuner) else kernel
    signature = {**pointers, **dict.fromkeys(integers, "i32"), **(typed or {})}
    signature = {arg: signature[arg] for arg in kernel.arg_names if arg in signature}
    return sm90_compiled(kernel, signature, {**case_constants, **constants}, num_warps=num_warps,
                         num_stages=num_stages, divisible_by_16=list(pointers), capability=capability)


@pytest.mark.parametrize("name", sorted(COMPILE_CASES))
def test_8bit_kernels_compile_for_sm90_without_spills(name, tmp_path):
    """Ahead-of-time sm_90 builds (no GPU needed) with the launch options the wrappers use."""
    from kernel_testing import local_memory_instructions

    if not HAS_TRITON:
        pytest.skip("triton not installed")
    compiled = _compile_case(name)
    assert compiled.metadata.shared <= 228 * 1024
    assert local_memory_instructions(compiled, tmp_path) in (0, None)  # no spilled registers


def test_every_moe_kernel_has_a_compile_case():
    """Each kernel that foldmill.moe.kernels launches (a Triton function named *_kernel) is built for
    sm_90 above."""
    import importlib
    import pkgutil

    if not HAS_TRITON:
        pytest.skip("triton not installed")
    import triton

    import foldmill.moe.kernels

    launched = set()
    for info in pkgutil.iter_modules(foldmill.moe.kernels.__path__):
        module = importlib.import_module(f"foldmill.moe.kernels.{info.name}")
        for name, value in vars(module).items():
            function = value.fn if isinstance(value, triton.runtime.Autotuner) else value
            if (name.endswith("_kernel") and isinstance(function, triton.runtime.JITFunction)
                    and function.fn.__module__ == module.__name__):
                launched.add(name)
    assert len(launched) >= 20
    assert launched == {name.split("[")[0] for name in COMPILE_CASES}


def test_mxfp8_gemm_lowers_to_the_block_scaled_mma_on_blackwell():
    """The block-scaled route's kernel (MMA_MODE "scaled") built for sm_100 ahead of time: tl.dot_scaled
    becomes the native block-scaled tensor-core MMA, not a dequantize-and-multiply fallback."""
    if not HAS_TRITON:
        pytest.skip("triton not installed")
    m, n, warps, stages = MX_GEMM_CONFIGS[0]
    for kernel in ("_grouped_forward_kernel", "_grouped_wgrad_kernel"):
        compiled = _compile_case(f"{kernel}[fp8 MMA, {m}x{n}, {warps} warps, {stages} stages]", capability=100,
                                 MMA_MODE="scaled")
        assert "tc_gen5_mma_scaled" in compiled.asm["ttgir"]
        assert compiled.asm["cubin"]


def test_mxfp8_kernels_refuse_shapes_they_cannot_block():
    """The round trip and the SwiGLU kernels that write MXFP8 copies check the block shape first,
    in one line naming the shape (behind ModelConfig's check, for callers of the kernels)."""
    from kernel_testing import HAS_TRITON

    if not HAS_TRITON:
        pytest.skip("triton not installed")
    from foldmill.moe.kernels.mx_quant import require_blocks

    require_blocks((64, 96), blocks_along_rows=True)
    require_blocks((48, 96), blocks_along_rows=False)
    for shape, along_rows in [((64, 48), False), ((48, 96), True)]:
        with pytest.raises(ValueError, match=r"multiples of 32, got \(\d+, \d+\)$"):
            require_blocks(shape, blocks_along_rows=along_rows)
