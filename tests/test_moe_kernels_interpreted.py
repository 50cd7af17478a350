"""MoE kernels under Triton's CPU interpreter, reached through the model's own dispatch: the routing
plan's kernels (plan_routing), the router's top-k softmax (top_k_softmax) and float32 logits
(router_logits), the clipping norm's sum of squares (clip_factor), AdamW's update of a bf16 weight's
float32 master (AdamW.step), and on the bf16-mixed path RMSNorm.add_and_norm (the fused add + RMSNorm
kernel on a float32 stream taking a bf16 delta), the experts' to_compute_dtype (a cast whose
gradient runs the upcast kernel), the MXFP8 SwiGLU kernels that store their input and the MXFP8
grouped GEMMs (mxfp8.mx_grouped_mm and mx_grouped_mm_wgrad). The kernels
run in a child process (kernel_testing.run_interpreted), where the modules' use_triton answers yes
for CPU tensors. GPU parity, the bf16 stream included, is in test_moe_gpu.py (the interpreter
rounds float32 to bf16 its own way, so bf16 outputs are not compared here)."""

from __future__ import annotations

import pytest
import torch
from kernel_testing import HAS_TRITON, relative_error, rms_norm_fp64, run_interpreted, serve_cases

from foldmill.moe.experts.routing import plan_routing
from foldmill.moe.model.router import TRITON_LOGITS_MAX_EXPERTS, top_k_softmax

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")

ROWS, COLS = 7, 96  # 96 columns: the kernel masks its 128-wide block

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _round_with_float8_cast(y):
        """E4M3 rounding the interpreter can run (mx_quant.round_to_e4m3 is PTX)."""
        return y.to(tl.float8e4nv).to(tl.float32)


def test_host_grid_arithmetic_gives_tritons_numbers():
    """The kernels' host code sizes grids and blocks with plain-Python cdiv and next_power_of_2 (each
    call of Triton's costs the host about 1.8 us): the same numbers as Triton's."""
    from foldmill.moe.kernels.grid import cdiv, next_power_of_2

    for divisor in (1, 2, 16, 32, 64, 100, 128, 256, 4096):
        for value in [*range(0, 600), 16384, 16385, 65535, 65536, 2**31 + 1]:
            assert cdiv(value, divisor) == triton.cdiv(value, divisor), (value, divisor)
    edges = [2**k + d for k in range(40) for d in (-1, 0, 1)]
    for value in [*range(0, 5000), *edges]:
        assert next_power_of_2(value) == triton.next_power_of_2(value), value


def test_fused_add_rms_norm_on_a_float32_stream_through_the_dispatch_matches_fp64(tmp_path):
    """A float32 stream with a bf16 delta takes the fused kernel; h is the eager add's, bit for bit;
    y and the gradients are within float32 rounding of fp64; delta's gradient is x's in bf16."""
    generator = torch.Generator().manual_seed(2)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator)

    case = {"name": "float32 stream", "kind": "norm", "dtype": "torch.float32", "x": randn(ROWS, COLS),
            "delta": randn(ROWS, COLS).bfloat16(), "weight": 1 + 0.2 * randn(COLS),
            "grad_h": randn(ROWS, COLS), "grad_y": randn(ROWS, COLS)}
    out = run_interpreted(__file__, [case], tmp_path, timeout=300)[case["name"]]
    assert "AddRMSNorm" in out["node"]
    assert out["h"].dtype == out["y"].dtype == torch.float32 and torch.equal(out["h"], case["x"] + case["delta"])
    assert out["ddelta"].dtype == torch.bfloat16 and torch.equal(out["ddelta"], out["dx"].bfloat16())
    want_y, want_h, want_weight = rms_norm_fp64(out["h"], case["weight"], case["grad_y"])
    want_dx = want_h + case["grad_h"].double()
    for got, want in ((out["y"], want_y), (out["dx"], want_dx), (out["dw"], want_weight)):
        assert relative_error(got, want) < 1e-6


def test_cast_for_compute_runs_the_upcast_kernel_and_keeps_the_gradient_bits(tmp_path):
    """A float32 tensor cast to bf16 or fp16 through the custom cast: the same values as torch's cast,
    and the gradient converted back by the kernel is the exact float32 of the incoming one, at
    sizes around the kernel's 4,096-element block."""
    cases = []
    for dtype in (torch.bfloat16, torch.float16):
        for numel in (1, 4097):
            generator = torch.Generator().manual_seed(numel)
            cases.append({"name": f"{dtype} {numel}", "kind": "cast", "dtype": str(dtype),
                          "t": torch.randn(numel, generator=generator) * 100,
                          "grad": (torch.randn(numel, generator=generator) * 100).to(dtype)})
    outputs = run_interpreted(__file__, cases, tmp_path, timeout=300)
    for case in cases:
        out = outputs[case["name"]]
        assert "CastForCompute" in out["node"], case["name"]
        assert torch.equal(out["out"], case["t"].to(case["grad"].dtype))
        assert out["grad"].dtype == torch.float32 and torch.equal(out["grad"], case["grad"].float())


def test_routing_plan_kernels_give_the_torch_plan(tmp_path):
    """Every buffer row, group end and count of the Triton plan equals the torch plan's (a stable
    sort by expert): several chunks, experts no slot chose, a non-power-of-two expert count, empty
    groups kept at one block (of 32 rows, and of one row as the quack backend plans), no padding, and
    many experts (small chunks)."""
    shapes = [("chunks", 1500, 2, 8, 16, False), ("unused experts", 300, 2, 8, 32, True),
              ("five experts", 700, 3, 5, 16, False), ("no padding", 900, 2, 8, 1, False),
              ("many experts", 260, 6, 64, 16, False), ("unused experts, one row each", 300, 2, 8, 1, True)]
    cases = []
    for name, tokens, top_k, experts, pad, nonempty in shapes:
        generator = torch.Generator().manual_seed(tokens)
        chosen = experts - 2 if name.startswith("unused experts") else experts
        cases.append({"name": name, "kind": "plan", "dtype": "torch.float32", "experts": experts, "pad": pad,
                      "nonempty": nonempty, "index": torch.randint(0, chosen, (tokens, top_k), generator=generator)})
    outputs = run_interpreted(__file__, cases, tmp_path, timeout=300)
    for case in cases:
        out = outputs[case["name"]]
        assert out["kernel"], case["name"]
        want = plan_routing(case["index"], case["experts"], case["pad"], case["nonempty"])
        for field in ("slot_rows", "source_slots", "group_ends", "tokens_per_expert"):
            got, expected = out[field], getattr(want, field)
            assert got.dtype == expected.dtype and torch.equal(got, expected), (case["name"], field)


def test_gradient_sum_of_squares_kernel_matches_fp64(tmp_path):
    """The clipping norm's kernel over gradients of mixed dtypes and sizes (one element, several
    64K-element chunks, an empty tensor): the float64 sum of squares, to float32 rounding."""
    generator = torch.Generator().manual_seed(5)
    grads = [torch.randn(shape, generator=generator) * scale for shape, scale in
             (((1,), 3.0), ((140_000,), 1e-3), ((0,), 1.0), ((33, 65), 10.0), ((70_000,), 1.0))]
    grads = [grad.bfloat16() if index % 2 else grad for index, grad in enumerate(grads)]
    case = {"name": "grads", "kind": "sum of squares", "dtype": "torch.float32", "grads": grads}
    out = run_interpreted(__file__, [case], tmp_path, timeout=300)["grads"]
    assert out["kernel"]
    want = sum(float(grad.double().square().sum()) for grad in grads)
    assert out["total"].dtype == torch.float32 and abs(float(out["total"]) - want) <= 1e-6 * want


def test_adamw_kernel_updates_a_bf16_weights_master_as_a_float32_weight(tmp_path):
    """The AdamW kernel on a float32 master with the bf16 weight's bf16 gradient: the master, the
    states and the step are those of the same kernel on a float32 weight with the gradient's
    float32 values, and the bf16 weight receives the master rounded (within one bf16 ulp: the
    interpreter does not round to nearest; the GPU test checks the rounding bit for bit)."""
    generator = torch.Generator().manual_seed(6)
    case = {"name": "master", "kind": "adamw", "dtype": "torch.float32",
            "weight": torch.randn(3, 1500, generator=generator),
            "grads": [(torch.randn(3, 1500, generator=generator) * 10.0 ** -step).bfloat16() for step in range(3)]}
    out = run_interpreted(__file__, [case], tmp_path, timeout=300)["master"]
    assert out["kernel"]
    assert torch.equal(out["master"], out["float32 weight"]) and not torch.equal(out["master"], case["weight"])
    assert torch.equal(out["master exp_avg_sq"], out["float32 exp_avg_sq"])
    assert out["master exp_avg_sq"].dtype == torch.float32
    rounded, master = out["bf16 weight"], out["master"]
    assert rounded.dtype == torch.bfloat16
    assert float(((rounded.float() - master).abs() / master.abs()).max()) <= 2.0**-7  # the interpreter truncates


def test_top_k_softmax_kernels_match_the_float64_router(tmp_path):
    """The router's top-k softmax kernels through the router's dispatch, forward and backward: the
    experts torch picks, the weights, the per-expert sums and the logits' gradient (from the weights
    and the load-balancing sums) within float32 rounding of float64; several programs with a partial
    last one, a non-power-of-two expert count with top-3, many experts; ties go to the lower index."""
    cases = []
    for name, tokens, experts, top_k in (("8 experts", 300, 8, 2), ("five experts", 130, 5, 3),
                                         ("many experts", 70, 64, 6)):
        generator = torch.Generator().manual_seed(tokens)
        cases.append({"name": name, "kind": "router", "dtype": "torch.float32", "top_k": top_k,
                      "logits": torch.randn(tokens, experts, generator=generator) * 3,
                      "grad_weights": torch.randn(tokens, top_k, generator=generator),
                      "grad_sums": torch.randn(experts, generator=generator)})
    ties = torch.zeros(3, 8)
    ties[1, 5:] = 1.0
    cases.append({"name": "ties", "kind": "router", "dtype": "torch.float32", "top_k": 2, "logits": ties,
                  "grad_weights": torch.ones(3, 2), "grad_sums": torch.ones(8)})
    outputs = run_interpreted(__file__, cases, tmp_path, timeout=300)
    for case in cases:
        out = outputs[case["name"]]
        assert out["node"] == "TopKSoftmaxBackward", case["name"]
        if case["name"] == "ties":
            assert out["experts"].tolist() == [[0, 1], [5, 6], [0, 1]]
            continue
        logits = case["logits"].double().requires_grad_()
        weights, experts, sums = top_k_softmax(logits, case["top_k"])
        (grad,) = torch.autograd.grad([weights, sums[0]], logits, [case["grad_weights"].double(),
                                                                   case["grad_sums"].double()])
        assert out["experts"].dtype == torch.int64 and torch.equal(out["experts"], experts), case["name"]
        for field, want in (("weights", weights), ("sums", sums), ("grad", grad)):
            assert out[field].dtype == torch.float32, (case["name"], field)
            assert relative_error(out[field], want.detach()) < 1e-6, (case["name"], field)


def test_router_logits_kernels_match_float64(tmp_path):
    """The float32 router logits' kernels through the router's dispatch, forward and backward: the
    logits and both gradients within float32 rounding of float64; partial token and hidden blocks at
    8 experts, a non-power-of-two expert count, the most experts the router sends the kernels, and
    64 experts, which the router leaves to torch (the kernels are called directly)."""
    cases = []
    for name, tokens, hidden, experts in (("8 experts", 300, 200, 8), ("five experts", 70, 96, 5),
                                          ("16 experts", 40, 64, TRITON_LOGITS_MAX_EXPERTS),
                                          ("many experts", 33, 64, 64)):
        generator = torch.Generator().manual_seed(tokens)
        cases.append({"name": name, "kind": "router logits", "dtype": "torch.float32",
                      "x": torch.randn(tokens, hidden, generator=generator),
                      "weight": torch.randn(experts, hidden, generator=generator) * 0.02,
                      "grad": torch.randn(tokens, experts, generator=generator)})
    outputs = run_interpreted(__file__, cases, tmp_path, timeout=300)
    for case in cases:
        out = outputs[case["name"]]
        many = case["weight"].shape[0] > TRITON_LOGITS_MAX_EXPERTS
        assert (out["node"] == "RouterLogitsBackward") != many, case["name"]
        x, weight = case["x"].double().requires_grad_(), case["weight"].double().requires_grad_()
        logits = x @ weight.t()
        grad_x, grad_weight = torch.autograd.grad(logits, [x, weight], case["grad"].double())
        for field, want in (("logits", logits), ("dx", grad_x), ("dw", grad_weight)):
            assert out[field].dtype == torch.float32, (case["name"], field)
            assert out[field].shape == want.shape, (case["name"], field)
            assert relative_error(out[field], want.detach()) < 1e-6, (case["name"], field)


def test_mxfp8_swiglu_kernels_storing_their_input_agree_with_the_quantizer_and_themselves(tmp_path):
    """The SwiGLU kernels of moe.mxfp8_store_swiglu_input through the MXFP8 backend's dispatch: the
    forward writes a's values as without the option and h's copy as the quantizer kernel does (its
    scales as the torch quantizer's); from that copy, a's along-rows values and the backward's copies
    and dp are those of the same kernels on the copy's values. The interpreter cannot run the PTX
    conversion to E4M3, so the child rounds with Triton's float8 cast, for every kernel alike: these
    are checks of where each kernel reads and writes, the GPU test checks the bits (two FFN widths,
    one with a partial last tile)."""
    cases = []
    for ffn in (96, 160):
        generator = torch.Generator().manual_seed(ffn)
        h = torch.randn(64, 2 * ffn, generator=generator) * torch.exp(torch.randn(64, 1, generator=generator) * 3)
        cases.append({"name": f"ffn {ffn}", "kind": "mx swiglu", "dtype": "torch.bfloat16", "h": h.bfloat16(),
                      "p": torch.rand(64, generator=generator),
                      "grad_a": torch.randn(64, ffn, generator=generator).bfloat16()})
    outputs = run_interpreted(__file__, cases, tmp_path, timeout=300)
    from foldmill.moe.quant.mx import quantize_mx

    for case in cases:
        out = outputs[case["name"]]
        assert torch.equal(out["h scale"], quantize_mx(case["h"]).scale), case["name"]
        for name in ("h data", "h scale", "a values", "a along rows", "grad along cols", "grad along rows", "dp"):
            assert torch.equal(out[name], out[f"want {name}"]), (case["name"], name)


def test_mxfp8_grouped_gemms_give_the_block_scaled_products(tmp_path):
    """The Triton MXFP8 grouped GEMMs (the block-scaled route's kernels, in their Hopper FP8-MMA mode)
    through mxfp8.mx_grouped_mm and mx_grouped_mm_wgrad: the products of the dequantized operands to
    float32 accumulation, with uneven groups, an expert no row chose, rows after the last group,
    partial tiles along N and K, and zeros for the empty expert's weight gradient. One 32 x 32 tile
    shape, as the interpreter cannot time the autotuner's; the GPU tests run the tuned kernels."""
    generator = torch.Generator().manual_seed(5)
    case = {"name": "gemms", "kind": "mx gemm", "dtype": "torch.float32",
            "x": torch.randn(160, 96, generator=generator), "w": torch.randn(3, 80, 96, generator=generator),
            "dy": torch.randn(160, 80, generator=generator),
            "ends": torch.tensor([40, 40, 150], dtype=torch.int32),
            "wgrad ends": torch.tensor([64, 64, 160], dtype=torch.int32)}
    out = run_interpreted(__file__, [case], tmp_path, timeout=600)["gemms"]
    from foldmill.moe.quant.mx import quantize_mx

    x, w = quantize_mx(case["x"]).dequantize().double(), quantize_mx(case["w"]).dequantize().double()
    want = torch.cat([x[0:40] @ w[0].t(), x[40:150] @ w[2].t()])
    assert out["kernel calls"] == 2
    assert relative_error(out["y"][:150], want) < 1e-6
    a, b = quantize_mx(case["dy"].t()).dequantize().double(), quantize_mx(case["x"].t()).dequantize().double()
    bounds = [(0, 64), (64, 64), (64, 160)]
    want_dw = torch.stack([a[:, start:stop] @ b[:, start:stop].t() for start, stop in bounds])
    assert relative_error(out["dw"], want_dw) < 1e-6
    assert torch.count_nonzero(out["dw"][1]) == 0


def _bits(t: torch.Tensor) -> torch.Tensor:
    """A bf16 or MXFP8 tensor's bits, so that NaNs compare equal."""
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t.view(torch.uint8)


def _mx_swiglu_case(case: dict) -> dict:
    """Child process: the stored-input SwiGLU kernels and what each must equal (see the test)."""
    from foldmill.moe.experts import mxfp8
    from foldmill.moe.kernels import mx_quant

    mx_quant.round_to_e4m3 = _round_with_float8_cast
    mxfp8.use_triton = lambda tensor: True
    from foldmill.moe.kernels.swiglu import swiglu_backward_mx_triton, swiglu_forward_mx_triton, swiglu_forward_triton

    h, p, grad_a = case["h"], case["p"], case["grad_a"]
    out = mxfp8.swiglu_forward_storing_input(h, p)
    stored = out.stored
    want_h = mx_quant.quantize_mx_triton(h)
    values = stored.values()
    _, want_rows, _ = mx_quant.mx_round_trip_triton(swiglu_forward_triton(values, p), False, True, False, h.dtype)
    grad, dp = mxfp8.swiglu_backward_copies(stored, p, grad_a)
    want_cols, want_grad_rows, want_dp = swiglu_backward_mx_triton(values, p, grad_a)
    return {"h data": _bits(stored.h.data), "want h data": _bits(want_h.data), "h scale": stored.h.scale,
            "want h scale": want_h.scale, "a values": _bits(out.operand.along_cols),
            "want a values": _bits(swiglu_forward_mx_triton(h, p)[0]),
            "a along rows": _bits(mxfp8.stored_swiglu_along_rows(stored)), "want a along rows": _bits(want_rows),
            "grad along cols": _bits(grad.along_cols), "want grad along cols": _bits(want_cols),
            "grad along rows": _bits(grad.along_rows), "want grad along rows": _bits(want_grad_rows),
            "dp": dp, "want dp": want_dp}


def _run_case(case: dict, dtype: torch.dtype) -> dict:
    """Child process (TRITON_INTERPRET=1): one case through the model's dispatch."""
    from foldmill.moe.experts import routing
    from foldmill.moe.model import moe, norm

    if case["kind"] == "mx swiglu":
        return _mx_swiglu_case(case)
    if case["kind"] == "mx gemm":
        return _mx_gemm_case(case)
    if case["kind"] == "sum of squares":
        from foldmill.moe.kernels import grad_norm
        from foldmill.moe.parallel import gradients

        gradients.use_triton = lambda tensor: True
        calls = []
        original = grad_norm.sum_of_squares_triton
        grad_norm.sum_of_squares_triton = lambda tensors: calls.append(True) or original(tensors)
        total = gradients._sum_of_squares(case["grads"], torch.device("cpu"))
        return {"kernel": bool(calls), "total": total}
    if case["kind"] == "adamw":
        from foldmill.moe.kernels import adamw
        from foldmill.moe.train import optim

        optim.use_triton = lambda tensor: True
        calls = []
        original = adamw.adamw_step_triton
        adamw.adamw_step_triton = lambda *args, **kwargs: calls.append(True) or original(*args, **kwargs)
        weight = torch.nn.Parameter(case["weight"].clone())
        stored = torch.nn.Parameter(case["weight"].bfloat16())
        master = case["weight"].clone()
        plain = optim.AdamW([weight], lr=0.1, weight_decay=0.1)
        mastered = optim.AdamW([stored], lr=0.1, weight_decay=0.1, master_weights={stored: master})
        for grad in case["grads"]:
            weight.grad, stored.grad = grad.float(), grad
            scale = torch.tensor(0.5)
            plain.step(grad_scale=scale)
            mastered.step(grad_scale=scale)
        return {"kernel": len(calls) == 6, "master": master, "float32 weight": weight.detach(),
                "bf16 weight": stored.detach(), "master exp_avg_sq": mastered.state[stored]["exp_avg_sq"],
                "float32 exp_avg_sq": plain.state[weight]["exp_avg_sq"]}
    if case["kind"] == "router":
        from foldmill.moe.model import router

        router.use_triton = lambda tensor: True
        logits = case["logits"].clone().requires_grad_()
        weights, experts, sums = router.top_k_softmax(logits, case["top_k"])
        (grad,) = torch.autograd.grad([weights, sums[0]], logits, [case["grad_weights"], case["grad_sums"]])
        return {"node": type(weights.grad_fn).__name__, "weights": weights.detach(), "experts": experts,
                "sums": sums.detach(), "grad": grad}
    if case["kind"] == "router logits":
        from foldmill.moe.kernels.router_logits import RouterLogits
        from foldmill.moe.model import router

        router.use_triton = lambda tensor: True
        x, weight = case["x"].clone().requires_grad_(), case["weight"].clone().requires_grad_()
        logits = router.router_logits(x, weight)
        node = type(logits.grad_fn).__name__
        if node != "RouterLogitsBackward":  # many experts: the kernels called directly
            logits = RouterLogits.apply(x, weight)
        grad_x, grad_weight = torch.autograd.grad(logits, [x, weight], case["grad"])
        return {"node": node, "logits": logits.detach(), "dx": grad_x, "dw": grad_weight}
    if case["kind"] == "plan":
        routing.use_triton = lambda tensor: True
        kernel_plans = []
        original = routing._plan_in_torch
        routing._plan_in_torch = lambda *args: kernel_plans.append(False) or original(*args)
        plan = routing.plan_routing(case["index"], case["experts"], case["pad"], case["nonempty"])
        return {"kernel": not kernel_plans, **{field: getattr(plan, field) for field in
                                              ("slot_rows", "source_slots", "group_ends", "tokens_per_expert")}}

    norm.use_triton = moe.use_triton = lambda tensor: True
    if case["kind"] == "norm":
        module = norm.RMSNorm(COLS)
        module.weight.data.copy_(case["weight"])
        x, delta = case["x"].clone().requires_grad_(), case["delta"].clone().requires_grad_()
        h, y = module.add_and_norm(x, delta)
        torch.autograd.backward([h, y], [case["grad_h"], case["grad_y"]])
        return {"node": type(y.grad_fn).__name__, "h": h.detach(), "y": y.detach(), "dx": x.grad,
                "ddelta": delta.grad, "dw": module.weight.grad}
    t = case["t"].clone().requires_grad_()
    out = moe.to_compute_dtype(t, dtype)
    (grad,) = torch.autograd.grad(out, t, case["grad"])
    return {"node": type(out.grad_fn).__name__, "out": out.detach(), "grad": grad}


def _mx_gemm_case(case: dict) -> dict:
    """Child process: both MXFP8 grouped GEMMs through the backend's dispatch, in FP8-MMA mode."""
    import os

    import triton

    from foldmill.moe.experts import mxfp8
    from foldmill.moe.kernels import mx_grouped_gemm
    from foldmill.moe.quant.mx import quantize_mx

    os.environ["FOLDMILL_MX_MMA"] = "fp8"
    mxfp8.use_triton = lambda tensor: True
    for kernel in (mx_grouped_gemm._grouped_forward_kernel, mx_grouped_gemm._grouped_wgrad_kernel):
        kernel.configs = [triton.Config({"BLOCK_M": 32, "BLOCK_N": 32, "GROUP_M": 8}, num_warps=4, num_stages=2,
                                        pre_hook=mx_grouped_gemm._tile_shapes)]
    calls = []
    for name in ("mx_grouped_mm_triton", "mx_grouped_mm_wgrad_triton"):
        original = getattr(mx_grouped_gemm, name)
        setattr(mx_grouped_gemm, name, lambda *args, original=original: calls.append(True) or original(*args))
    y = mxfp8.mx_grouped_mm(quantize_mx(case["x"]), quantize_mx(case["w"]), case["ends"], torch.float32)
    dw = mxfp8.mx_grouped_mm_wgrad(quantize_mx(case["dy"].t()), quantize_mx(case["x"].t()), case["wgrad ends"],
                                   torch.float32)
    return {"kernel calls": len(calls), "y": y, "dw": dw}


if __name__ == "__main__":
    serve_cases(_run_case, patch_numpy=True)
