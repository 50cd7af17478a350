"""GPU checks of the MoE Triton kernels and backends (skipped without CUDA).

The MXFP8 quantizer must match the integer emulation bit for bit; the grouped GEMM must match
the exact dequantized product up to fp32 accumulation order; every backend's MoE layer is compared
with the fp32 reference on forward and all gradients.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from kernel_testing import relative_error, rms_norm_fp64
from test_moe_quant import adversarial

from foldmill.moe.experts.quack_fused import quack_installed
from foldmill.moe.experts.routing import plan_routing
from foldmill.moe.quant.mx import quantize_mx
from foldmill.moe.quant.mx_reference import quantize_mx_reference

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")
needs_quack = pytest.mark.skipif(not quack_installed(),
                                 reason="the quack backend needs QuACK (pip install quack-kernels)")
QUACK = pytest.param("quack", marks=needs_quack)


def test_triton_quantizer_matches_emulation_bit_for_bit():
    from foldmill.moe.kernels.mx_quant import quantize_mx_triton

    generator = torch.Generator().manual_seed(1)
    x = adversarial(96, 256, generator)
    for view in (x, x.t().contiguous().t()):
        q = quantize_mx_triton(view.to(CUDA))
        elements, scales = quantize_mx_reference(view.numpy())
        assert np.array_equal(q.data.view(torch.uint8).cpu().numpy(), elements)
        assert np.array_equal(q.scale.cpu().numpy(), scales)
    bf16 = torch.randn(64, 3, 96, generator=generator).bfloat16()
    q = quantize_mx_triton(bf16.to(CUDA).permute(1, 0, 2))
    reference = quantize_mx(bf16.permute(1, 0, 2))
    assert torch.equal(q.data.view(torch.uint8).cpu(), reference.data.view(torch.uint8))
    assert torch.equal(q.scale.cpu(), reference.scale)


@pytest.mark.parametrize("mode", ["fp8", "bf16", "scaled"])
def test_mx_grouped_gemm_matches_dequantized_product(monkeypatch, mode):
    from foldmill.moe.kernels.mx_grouped_gemm import mx_grouped_mm_triton, mx_grouped_mm_wgrad_triton

    monkeypatch.setenv("FOLDMILL_MX_MMA", mode)
    torch.manual_seed(2)
    experts, hidden, out = 5, 256, 384
    plan = plan_routing(torch.randint(0, experts, (700, 2)), experts, 32)
    plan.group_ends[1] = plan.group_ends[0]  # an empty expert
    ends = plan.group_ends.to(CUDA)
    end = int(ends[-1])
    x = torch.randn(plan.rows, hidden, device=CUDA)
    w = torch.randn(experts, out, hidden, device=CUDA)
    xq, wq = quantize_mx(x), quantize_mx(w)
    got = mx_grouped_mm_triton(xq, wq, ends, torch.float32)[:end]
    bounds = list(zip([0, *ends[:-1].tolist()], ends.tolist()))
    want = torch.cat([xq.dequantize()[s:e] @ wq.dequantize()[i].t() for i, (s, e) in enumerate(bounds)])
    assert float((got - want).norm() / want.norm()) < 2e-3
    dy = torch.randn(plan.rows, out, device=CUDA)
    a, b = quantize_mx(dy.t()), quantize_mx(x.t())
    got = mx_grouped_mm_wgrad_triton(a, b, ends, torch.float32)
    want = torch.stack([a.dequantize()[:, s:e] @ b.dequantize()[:, s:e].t() for s, e in bounds])
    assert float((got - want).norm() / want.norm()) < 2e-3
    assert torch.count_nonzero(got[1]) == 0


def test_fused_swiglu_and_permute_match_torch():
    from foldmill.moe.kernels.permute import permute_rows_triton, sum_rows_triton
    from foldmill.moe.kernels.swiglu import swiglu_backward_triton, swiglu_forward_triton

    torch.manual_seed(3)
    h = torch.randn(300, 512, device=CUDA, dtype=torch.bfloat16)
    p = torch.rand(300, device=CUDA)
    a = swiglu_forward_triton(h, p)
    gate, up = h.float().chunk(2, dim=-1)
    expected = (F.silu(gate) * up * p[:, None]).bfloat16()
    assert float((a.float() - expected.float()).abs().max()) <= 2 ** -7 * float(expected.float().abs().max())
    grad_a = torch.randn(300, 256, device=CUDA, dtype=torch.bfloat16)
    grad_h, grad_p = swiglu_backward_triton(h, p, grad_a)
    hh, pp = h.float().requires_grad_(), p.clone().requires_grad_()
    g, u = hh.chunk(2, dim=-1)
    (F.silu(g) * u * pp[:, None] * grad_a.float()).sum().backward()
    assert float((grad_h.float() - hh.grad).norm() / hh.grad.norm()) < 1e-2
    assert float((grad_p - pp.grad).norm() / pp.grad.norm()) < 1e-4

    plan = plan_routing(torch.randint(0, 8, (1000, 2), device=CUDA), 8, 32)
    x = torch.randn(1000, 640, device=CUDA, dtype=torch.bfloat16)
    probs = torch.rand(1000, 2, device=CUDA)
    rows, row_probs = permute_rows_triton(x, plan.source_slots, 2, probs)
    valid = plan.source_slots >= 0
    slots = plan.source_slots.clamp_min(0)
    assert torch.equal(rows, torch.where(valid[:, None], x[slots // 2], 0))
    assert torch.equal(row_probs, torch.where(valid, probs.flatten()[slots], 0))
    assert torch.allclose(sum_rows_triton(rows, plan.slot_rows).float(), 2 * x.float(), rtol=1e-2)


@pytest.mark.parametrize(("tokens", "top_k", "experts", "pad", "nonempty"),
                         [(8192, 2, 8, 16, True), (8192, 2, 8, 32, False), (32768, 2, 8, 16, True),
                          (8192, 2, 64, 1, False), (4096, 8, 128, 16, False), (8192, 2, 8, 1, True)])
def test_routing_plan_kernels_give_the_torch_plan_at_step_sizes(tokens, top_k, experts, pad, nonempty):
    """The step's slot counts (and many experts: 128 falls back to torch) give the torch plan's
    integers; skewed routing leaves experts empty and groups of very different sizes."""
    from foldmill.moe.experts import routing

    generator = torch.Generator(device=CUDA).manual_seed(tokens + experts)
    weights = torch.rand(experts, device=CUDA, generator=generator) ** 4
    index = torch.multinomial(weights.expand(tokens, -1), top_k, generator=generator)
    got = plan_routing(index, experts, pad, nonempty)
    flat = index.reshape(-1)
    capacity = got.source_slots.numel()
    want = routing._plan_in_torch(flat, experts, pad, nonempty, capacity)
    for field, expected in zip(("slot_rows", "source_slots", "group_ends", "tokens_per_expert"), want):
        value = getattr(got, field).reshape(expected.shape)
        assert value.dtype == expected.dtype and torch.equal(value, expected), field


def test_gradient_norm_kernel_is_the_float64_norm_and_can_be_captured():
    """clip_factor's kernel over gradients of mixed dtypes and sizes, one of them a view at an odd
    offset (torch's loop then): the float64 norm to float32 rounding, the same bits on every call,
    and inside a CUDA graph too."""
    from foldmill.moe.parallel.gradients import _sum_of_squares

    generator = torch.Generator(device=CUDA).manual_seed(4)
    grads = [torch.randn(numel, device=CUDA, generator=generator).to(dtype) * scale for numel, dtype, scale in
             ((1, torch.float32, 3.0), (9_000_001, torch.bfloat16, 1e-3), (65_536, torch.float32, 10.0),
              (4_096 * 2_048, torch.bfloat16, 1.0), (0, torch.bfloat16, 1.0))]
    want = sum(float(grad.double().square().sum()) for grad in grads)
    total = _sum_of_squares(grads, CUDA)
    assert abs(float(total) - want) <= 1e-6 * want
    assert torch.equal(_sum_of_squares(grads, CUDA), total)
    unaligned = torch.randn(1001, device=CUDA)[1:]
    assert abs(float(_sum_of_squares(grads + [unaligned], CUDA)) - want - float(unaligned.double().square().sum())) \
        <= 1e-6 * want
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = _sum_of_squares(grads, CUDA)
    graph.replay()
    assert torch.equal(captured, total)


@pytest.mark.parametrize(("backend", "tolerance", "fields"),
                         [("loop", 1e-2, {}), ("grouped", 1e-2, {}), ("fp8_rowwise", 0.1, {}), ("mxfp8", 0.1, {}),
                          ("mxfp8", 0.1, {"mxfp8_store_swiglu_input": True}),
                          pytest.param("quack", 1e-2, {}, marks=needs_quack)],
                         ids=["loop", "grouped", "fp8_rowwise", "mxfp8", "mxfp8 storing the SwiGLU input", "quack"])
def test_backend_layer_matches_fp32_reference_on_gpu(backend, tolerance, fields):
    from test_moe_experts import compare_with_reference

    compare_with_reference(backend, CUDA, torch.bfloat16, tolerance, hidden=256, ffn=512, tokens=2048, **fields)


@needs_quack
@pytest.mark.parametrize(("experts", "hidden", "ffn", "tokens", "pin_every_gemm"),
                         [(6, 256, 384, 1000, False), (8, 2048, 4096, 4000, False), (6, 256, 384, 1000, True)],
                         ids=["small", "bio_8x1b experts, measured tiles", "small, every GEMM on pinned tiles"])
def test_quack_experts_match_float64_with_uneven_groups_and_an_expert_nobody_chose(experts, hidden, ffn, tokens,
                                                                                    pin_every_gemm, monkeypatch,
                                                                                    request):
    """The SwiGLU in QuACK's epilogues (h interleaved, w13 read and its gradient written as [gate;
    up]) gives the expert MLP's output and every gradient; the unchosen expert's one zero row gives
    it a zero weight gradient. At bio_8x1b's expert shape the epilogue GEMMs run with the tiles
    measured for them (MEASURED_TILES) instead of QuACK's default; pinned, every GEMM runs on the
    tiles given, the plain ones on those measured at Mixtral-8x7B's experts."""
    from foldmill.moe.experts import get_backend, quack_fused
    from foldmill.moe.experts.mlp import grouped_swiglu_experts
    from foldmill.moe.experts.routing import permute_tokens

    if pin_every_gemm:
        mixtral = ("NVIDIA H100 80GB HBM3", 4096, 14336)
        tiles = {kernel: quack_fused.MEASURED_TILES[(kernel, *mixtral)] for kernel in ("dgated", "down", "grad_x",
                                                                                      "grad_w13")}
        tiles["gated"] = quack_fused.PINGPONG_128X128
        tiles["grad_w2"] = {"tile_m": 128, "tile_n": 256, "pingpong": False, "cluster_m": 2, "cluster_n": 1}
        gpu = torch.cuda.get_device_name()
        pins = {(kernel, gpu, hidden, ffn): kernel_tiles for kernel, kernel_tiles in tiles.items()}
        monkeypatch.setattr(quack_fused, "MEASURED_TILES", pins)
        quack_fused.tile_config.cache_clear()
        request.addfinalizer(quack_fused.tile_config.cache_clear)  # no pin outlives the test
        assert all(quack_fused.tile_config(kernel, torch.device(CUDA), hidden, ffn) is not None
                   for kernel, *_ in pins)

    torch.manual_seed(5)
    choice = torch.randint(0, experts - 1, (tokens, 1))
    choice[choice >= 1] += 1  # expert 1 is never chosen
    backend = get_backend("quack")
    plan = plan_routing(choice.to(CUDA), experts, backend.pad_multiple, backend.nonempty_groups)
    ends = plan.group_ends
    assert int(ends[1] - ends[0]) == 1
    rows, row_probs = permute_tokens(torch.randn(tokens, hidden, device=CUDA, dtype=torch.bfloat16),
                                     torch.rand(tokens, 1, device=CUDA), plan)
    w13 = torch.randn(experts, 2 * ffn, hidden, device=CUDA, dtype=torch.bfloat16) / hidden**0.5
    w2 = torch.randn(experts, hidden, ffn, device=CUDA, dtype=torch.bfloat16) / ffn**0.5
    grad_y = torch.randn(rows.shape[0], hidden, device=CUDA, dtype=torch.bfloat16)
    end = int(ends[-1])
    grad_y[end:] = 0

    def run(backend_name, device, dtype):
        leaves = [t.detach().to(device, dtype).requires_grad_() for t in (rows, row_probs, w13, w2)]
        y = grouped_swiglu_experts(*leaves[:2], *leaves[2:], ends.to(device), get_backend(backend_name))
        y.backward(grad_y.to(device, dtype))
        return [y.detach()[:end]] + [leaf.grad for leaf in leaves]

    got = run("quack", CUDA, torch.bfloat16)
    want = run("loop", torch.device("cpu"), torch.float64)
    got[1], want[1] = got[1][:end], want[1][:end]
    got[2], want[2] = got[2][:end], want[2][:end]
    for name, g, w in zip(("y", "x", "row_probs", "w13", "w2"), got, want):
        assert relative_error(g.double().cpu(), w) < 1e-2, name
    assert not got[3][1].any() and not got[4][1].any()


def test_router_logits_on_tensor_cores_keep_float32_accuracy():
    """bf16 router logits from tensor cores (float32 sums) and their gradients (the float32 logit
    gradient split into three bf16 terms) against fp64: logits at float32 accuracy; each gradient
    element within one bf16 step of the exact value plus a float32 sum's error."""
    from foldmill.moe.model.router import _TensorCoreLogits, router_logits

    torch.manual_seed(3)
    x = torch.randn(4096, 2048, device=CUDA).bfloat16().requires_grad_()
    weight = (torch.randn(8, 2048, device=CUDA) * 0.02).bfloat16().requires_grad_()
    grad = torch.randn(4096, 8, device=CUDA) * torch.logspace(-6, 0, 8, device=CUDA)
    logits = router_logits(x, weight)
    assert logits.dtype == torch.float32 and logits.grad_fn.name() == _TensorCoreLogits.__name__ + "Backward"
    logits.backward(grad)
    x64, weight64, grad64 = x.detach().double(), weight.detach().double(), grad.double()
    exact = x64 @ weight64.t()
    assert float((logits.detach().double() - exact).norm() / exact.norm()) < 1e-5
    # the gradients, and the sums of their terms' magnitudes (a float32 sum errs by a fraction of it)
    for got, want, magnitude in ((x.grad, grad64 @ weight64, grad64.abs() @ weight64.abs()),
                                 (weight.grad, grad64.t() @ x64, grad64.abs().t() @ x64.abs())):
        ulp = 2.0 ** (torch.frexp(want.float())[1] - 8).double()  # one bf16 step at each exact value
        assert bool(((got.double() - want).abs() <= ulp + 2.0**-18 * magnitude).all())


def test_top_k_softmax_kernels_match_the_float64_router():
    """The router's Triton top-k softmax at bio_8x1b's routing shape (8,192 tokens, 8 experts, top-2)
    and at 64 experts, top-6: torch's experts, and the weights, per-expert sums and the logits'
    gradient within float32 rounding of float64."""
    from foldmill.moe.kernels.router import TopKSoftmax
    from foldmill.moe.model.router import top_k_softmax

    generator = torch.Generator(device=CUDA).manual_seed(7)
    for tokens, experts, top_k in ((8192, 8, 2), (1000, 64, 6)):
        logits = (torch.randn(tokens, experts, device=CUDA, generator=generator) * 2).requires_grad_()
        grad_weights = torch.randn(tokens, top_k, device=CUDA, generator=generator)
        grad_sums = torch.randn(experts, device=CUDA, generator=generator)
        weights, chosen, sums = top_k_softmax(logits, top_k)
        assert weights.grad_fn.name() == TopKSoftmax.__name__ + "Backward"
        (grad,) = torch.autograd.grad([weights, sums[0]], logits, [grad_weights, grad_sums])
        logits64 = logits.detach().double().requires_grad_()
        weights64, chosen64, sums64 = top_k_softmax(logits64, top_k)
        (grad64,) = torch.autograd.grad([weights64, sums64[0]], logits64, [grad_weights.double(), grad_sums.double()])
        assert torch.equal(chosen, chosen64)
        for got, want in ((weights, weights64), (sums, sums64), (grad, grad64)):
            assert got.dtype == torch.float32 and relative_error(got.detach(), want.detach()) < 1e-6


def test_float32_router_logits_kernels_match_float64():
    """The float32 router logits' Triton kernels (the bf16-mixed recipe's router) at bio_8x1b's
    routing shape (8,192 tokens, hidden 2,048, 8 experts) and at the most experts the router sends
    them (16), through the router's dispatch under bf16 autocast, and at 64 experts called directly
    (the router keeps cuBLAS there): float32 logits, and the logits, dx and dw within float32
    rounding of float64; the weight gradient's bits are the same on a second run."""
    from foldmill.moe.kernels.router_logits import RouterLogits
    from foldmill.moe.model.router import TRITON_LOGITS_MAX_EXPERTS, router_logits

    generator = torch.Generator(device=CUDA).manual_seed(11)
    for tokens, hidden, experts in ((8192, 2048, 8), (1000, 2048, TRITON_LOGITS_MAX_EXPERTS), (1000, 2048, 64)):
        x = torch.randn(tokens, hidden, device=CUDA, generator=generator).requires_grad_()
        weight = (torch.randn(experts, hidden, device=CUDA, generator=generator) * 0.02).requires_grad_()
        grad = torch.randn(tokens, experts, device=CUDA, generator=generator)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = router_logits(x, weight)
        dispatched = logits.grad_fn.name() == RouterLogits.__name__ + "Backward"
        assert logits.dtype == torch.float32 and dispatched == (experts <= TRITON_LOGITS_MAX_EXPERTS)
        if not dispatched:
            logits = RouterLogits.apply(x, weight)
        grad_x, grad_weight = torch.autograd.grad(logits, [x, weight], grad, retain_graph=True)
        assert torch.equal(torch.autograd.grad(logits, weight, grad)[0], grad_weight)
        x64, weight64 = x.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
        logits64 = x64 @ weight64.t()
        grad_x64, grad_weight64 = torch.autograd.grad(logits64, [x64, weight64], grad.double())
        for got, want in ((logits, logits64), (grad_x, grad_x64), (grad_weight, grad_weight64)):
            assert got.dtype == torch.float32 and relative_error(got.detach(), want.detach()) < 1e-6


def test_shared_input_projections_sum_the_input_gradient_in_float32_under_autocast():
    """Attention's q, k and v projections at bio_8x1b's widths under bf16 autocast (the bf16-mixed
    recipe): bf16 outputs, and the input's gradient (summed inside the GEMMs) and the weights'
    gradients in float32, within float32 accuracy of the exact sums of the bf16 products (separate
    bf16 linears round each product to bf16, 2^-9, before converting it)."""
    from foldmill.moe.model.projections import project

    torch.manual_seed(9)
    x = torch.randn(4096, 2048, device=CUDA).requires_grad_()
    weights = [(torch.randn(n, 2048, device=CUDA) * 0.02).requires_grad_() for n in (2048, 1024, 1024)]
    grads = [torch.randn(4096, n, device=CUDA).bfloat16() for n in (2048, 1024, 1024)]
    with torch.autocast("cuda", dtype=torch.bfloat16):
        outputs = project(x, weights)
    torch.autograd.backward(outputs, grads)
    x64 = x.detach().bfloat16().double()
    weights64 = [weight.detach().bfloat16().double() for weight in weights]
    grads64 = [grad.double() for grad in grads]
    for out, weight64 in zip(outputs, weights64, strict=True):
        assert out.dtype == torch.bfloat16 and relative_error(out.detach(), x64 @ weight64.t()) < 2.0**-8
    want_x = sum(grad64 @ weight64 for grad64, weight64 in zip(grads64, weights64, strict=True))
    assert x.grad.dtype == torch.float32 and relative_error(x.grad, want_x) < 1e-5
    for weight, grad64 in zip(weights, grads64, strict=True):
        assert weight.grad.dtype == torch.float32 and relative_error(weight.grad, grad64.t() @ x64) < 1e-5


@pytest.mark.parametrize("cols", [2048, 96])
def test_fused_add_rms_norm_matches_fp64(cols):
    """h = x + delta as the eager bf16 add gives it, bit for bit; y and the gradients of x (= delta's)
    and of the weight as close to fp64 as rounding the exact values to bf16 allows, with and
    without a gradient flowing into h."""
    from foldmill.moe.kernels.rms_norm import add_rms_norm_triton

    torch.manual_seed(4)
    x, delta, grad_h, grad_y = (torch.randn(2, 300, cols, device=CUDA).bfloat16() for _ in range(4))
    x.requires_grad_()
    delta.requires_grad_()
    weight = (1 + 0.2 * torch.randn(cols, device=CUDA)).bfloat16().requires_grad_()
    for with_grad_h in (True, False):
        h, y = add_rms_norm_triton(x, delta, weight, 1e-5)
        torch.autograd.backward([h, y] if with_grad_h else [y], [grad_h, grad_y] if with_grad_h else [grad_y])
        assert torch.equal(h, x.detach() + delta.detach())
        want_y, want_h, want_weight = rms_norm_fp64(h, weight, grad_y)
        want_x = want_h + (grad_h.double() if with_grad_h else 0)
        assert torch.equal(x.grad, delta.grad)
        for got, want in ((y, want_y), (x.grad, want_x), (weight.grad, want_weight)):
            assert relative_error(got.detach(), want) < 1.05 * relative_error(want.to(torch.bfloat16), want)
        x.grad = delta.grad = weight.grad = None


def test_fused_add_rms_norm_on_a_float32_stream_matches_fp64():
    """The bf16-mixed case: a float32 stream x and a bf16 delta. h is the eager add's, bit for bit;
    y and the gradients of x and the weight within float32 rounding of fp64; delta's gradient is
    x's rounded to bf16, as eager autograd gives it."""
    from foldmill.moe.kernels.rms_norm import add_rms_norm_triton

    torch.manual_seed(5)
    x = torch.randn(2, 300, 2048, device=CUDA).requires_grad_()
    delta = torch.randn(2, 300, 2048, device=CUDA).bfloat16().requires_grad_()
    weight = (1 + 0.2 * torch.randn(2048, device=CUDA)).requires_grad_()
    grad_h, grad_y = torch.randn(2, 2, 300, 2048, device=CUDA)
    h, y = add_rms_norm_triton(x, delta, weight, 1e-5)
    torch.autograd.backward([h, y], [grad_h, grad_y])
    assert h.dtype == y.dtype == torch.float32 and delta.grad.dtype == torch.bfloat16
    assert torch.equal(h, x.detach() + delta.detach())
    assert torch.equal(delta.grad, x.grad.bfloat16())
    want_y, want_h, want_weight = rms_norm_fp64(h, weight, grad_y)
    for got, want in ((y, want_y), (x.grad, want_h + grad_h.double()), (weight.grad, want_weight)):
        assert relative_error(got.detach(), want) < 1e-6


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_upcast_kernel_is_exact_and_the_cast_gradient_keeps_its_bits(dtype):
    """The vectorized conversion to float32 equals torch's, at sizes around the kernel's block and
    for a non-contiguous tensor (torch's path); a cast's gradient through it has the same bits as
    through torch's cast."""
    from foldmill.moe.kernels.cast import cast_for_compute_triton, upcast

    torch.manual_seed(6)
    for numel in (0, 1, 4095, 4097, 3 * 5000):
        t = (torch.randn(numel, device=CUDA) * 100).to(dtype)
        assert torch.equal(upcast(t, torch.float32), t.float())
    strided = torch.randn(64, 96, device=CUDA).to(dtype).t()
    assert torch.equal(upcast(strided, torch.float32), strided.float())
    master = torch.randn(4, 96, 64, device=CUDA, requires_grad=True)
    grad = torch.randn(4, 96, 64, device=CUDA).to(dtype)
    (fast,) = torch.autograd.grad(cast_for_compute_triton(master, dtype), master, grad)
    (eager,) = torch.autograd.grad(master.to(dtype), master, grad)
    assert fast.dtype == torch.float32 and torch.equal(fast, eager)


def test_experts_under_autocast_get_the_same_gradients_through_the_vectorized_cast(monkeypatch):
    """bf16-mixed: the experts' float32 weights and input are cast through moe/kernels/cast.py on
    CUDA; their gradients are the bits torch's cast gives."""
    from foldmill.moe.config import ModelConfig
    from foldmill.moe.model import moe as moe_module

    config = ModelConfig(hidden_size=256, ffn_size=512, num_layers=1)
    torch.manual_seed(7)
    with torch.device(CUDA):
        block = moe_module.MoEBlock(config)
    for parameter in block.parameters():
        torch.nn.init.normal_(parameter, std=0.05)
    x = torch.randn(512, 256, device=CUDA)

    def gradients():
        block.zero_grad(set_to_none=True)
        inputs = x.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = block(inputs).hidden
        out.float().square().sum().backward()
        return [inputs.grad, block.experts.gate_up_proj.grad, block.experts.down_proj.grad]

    fast = gradients()
    monkeypatch.setattr(moe_module, "use_triton", lambda tensor: False)
    eager = gradients()
    assert all(a.dtype == torch.float32 and torch.equal(a, b) for a, b in zip(fast, eager))


@pytest.mark.parametrize("fast", [True, False])
def test_fp8_accumulation_setting_reaches_the_kernel_and_stays_within_tolerance(monkeypatch, fast):
    """Every FP8 GEMM of forward and backward gets moe.fp8_fast_accumulation, and either way the
    layer and its gradients stay within the 8-bit tolerance of fp64 (K up to 1,024)."""
    from test_moe_experts import compare_with_reference

    seen = []
    scaled_grouped_mm = torch._scaled_grouped_mm

    def recording(*args, use_fast_accum=False, **kwargs):
        seen.append(use_fast_accum)
        return scaled_grouped_mm(*args, use_fast_accum=use_fast_accum, **kwargs)

    monkeypatch.setattr(torch, "_scaled_grouped_mm", recording)
    compare_with_reference("fp8_rowwise", CUDA, torch.bfloat16, 0.1, hidden=512, ffn=1024, tokens=2048,
                           fp8_fast_accumulation=fast)
    assert len(seen) == 6 and set(seen) == {fast}  # forward, dgrad, wgrad of both expert GEMMs


@pytest.mark.parametrize("backend", ["grouped", "fp8_rowwise", "mxfp8", QUACK])
def test_recomputed_expert_hidden_gives_the_same_gradients_on_gpu(backend):
    from test_moe_experts import gradients_with_and_without_recompute

    results, _ = gradients_with_and_without_recompute(backend, CUDA, torch.bfloat16, hidden=256, ffn=512, tokens=2048)
    for kept, recomputed in zip(results[False], results[True]):
        assert torch.equal(kept, recomputed)


def assert_same_bits(got: torch.Tensor, want: torch.Tensor) -> None:
    """Bit-identical bf16 values, NaN wherever the other has NaN (NaN sign and payload aside)."""
    got, want = got.cpu(), want.cpu().contiguous()
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))


def test_mx_round_trip_kernel_is_bit_exact_against_emulation():
    from foldmill.moe.kernels.mx_quant import dequantize_along_rows_triton, mx_round_trip_triton

    generator = torch.Generator().manual_seed(4)
    x = adversarial(96, 256, generator)
    want_cols = quantize_mx(x).dequantize(torch.bfloat16)
    want_rows = quantize_mx(x.t()).dequantize(torch.bfloat16).t()
    for view in (x, x.t().contiguous().t()):
        by_cols, by_rows, kept = mx_round_trip_triton(view.to(CUDA), True, True, True, torch.bfloat16)
        assert_same_bits(by_cols, want_cols)
        assert_same_bits(by_rows, want_rows)
        reference = quantize_mx(x.t())
        assert torch.equal(kept.data.view(torch.uint8).cpu(), reference.data.view(torch.uint8))
        assert torch.equal(kept.scale.cpu(), reference.scale)
        values = dequantize_along_rows_triton(kept, torch.bfloat16)
        assert_same_bits(values, want_rows)
    weight = torch.randn(3, 64, 96, generator=generator).bfloat16()
    _, by_rows, _ = mx_round_trip_triton(weight.to(CUDA), False, True, False, torch.bfloat16)
    want = quantize_mx(weight.transpose(-2, -1)).dequantize(torch.bfloat16).transpose(-2, -1)
    assert_same_bits(by_rows, want)


def swiglu_case(ffn: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(h (320, 2F) bf16 with rows of very different scales and one NaN, p, grad_a (320, F) bf16) on the GPU."""
    generator = torch.Generator().manual_seed(seed)
    rows = 320
    h = torch.randn(rows, 2 * ffn, generator=generator) * torch.exp(torch.randn(rows, 1, generator=generator) * 4)
    h[5, 7] = float("nan")
    p = torch.rand(rows, generator=generator)
    grad_a = (torch.randn(rows, ffn, generator=generator) * 10.0 ** torch.randint(-6, 3, (rows, 1))).bfloat16()
    return h.bfloat16().to(CUDA), p.to(CUDA), grad_a.to(CUDA)


@pytest.mark.parametrize("ffn", [256, 1056])
def test_swiglu_kernels_write_the_same_mxfp8_copies_as_the_separate_round_trip(ffn):
    """The MXFP8 backend's SwiGLU writes its outputs' copies itself: bit for bit those that the plain
    SwiGLU followed by mx_round_trip_triton gives (rows of very different scales, a NaN row too)."""
    from foldmill.moe.kernels.mx_quant import dequantize_along_rows_triton, mx_round_trip_triton
    from foldmill.moe.kernels.swiglu import (
        swiglu_backward_mx_triton,
        swiglu_backward_triton,
        swiglu_forward_mx_triton,
        swiglu_forward_triton,
    )

    h, p, grad_a = swiglu_case(ffn, seed=9)

    values, kept = swiglu_forward_mx_triton(h, p)
    want_values, _, want_kept = mx_round_trip_triton(swiglu_forward_triton(h, p), True, False, True, torch.bfloat16)
    assert_same_bits(values, want_values)
    assert torch.equal(kept.data.view(torch.uint8), want_kept.data.view(torch.uint8))
    assert torch.equal(kept.scale, want_kept.scale)
    assert_same_bits(dequantize_along_rows_triton(kept, torch.bfloat16),
                     dequantize_along_rows_triton(want_kept, torch.bfloat16))

    along_cols, along_rows, grad_p = swiglu_backward_mx_triton(h, p, grad_a)
    grad_h, want_grad_p = swiglu_backward_triton(h, p, grad_a)
    want_cols, want_rows, _ = mx_round_trip_triton(grad_h, True, True, False, torch.bfloat16)
    assert_same_bits(along_cols, want_cols)
    assert_same_bits(along_rows, want_rows)
    assert_grad_p_close(grad_p, want_grad_p, h, grad_a)


def assert_grad_p_close(grad_p, want_grad_p, h, grad_a):
    """grad_p sums F terms of both signs, in an order set by the kernel's tile layout: hold it to the
    sum of their magnitudes."""
    gate, up = h.float().chunk(2, dim=-1)
    magnitude = (grad_a.float() * F.silu(gate) * up).abs().sum(-1)
    finite = torch.isfinite(want_grad_p)
    assert torch.equal(torch.isfinite(grad_p), finite)
    assert bool(((grad_p - want_grad_p).abs()[finite] <= 1e-5 * magnitude[finite]).all())


@pytest.mark.parametrize("ffn", [256, 1056])
def test_swiglu_kernels_storing_their_input_give_the_separate_steps_bits(ffn):
    """With the MXFP8 backend's store_swiglu_input, the forward kernel writes a's copy along F as it
    does without, and h's MXFP8 copy as quantize_mx_triton makes it; from that copy, a's along-rows
    values and the backward kernel's copies are, bit for bit, those of the same kernels run on the
    copy's values in bf16, and dp is theirs up to summation order (rows of very different scales,
    a NaN row too)."""
    from foldmill.moe.kernels.mx_quant import mx_round_trip_triton, quantize_mx_triton
    from foldmill.moe.kernels.swiglu import (
        swiglu_along_rows_from_stored_triton,
        swiglu_backward_mx_triton,
        swiglu_forward_mx_triton,
        swiglu_forward_triton,
    )

    h, p, grad_a = swiglu_case(ffn, seed=10)

    values, h_mx = swiglu_forward_mx_triton(h, p, store_input=True)
    assert_same_bits(values, swiglu_forward_mx_triton(h, p)[0])
    want_h = quantize_mx_triton(h)
    assert torch.equal(h_mx.data.view(torch.uint8), want_h.data.view(torch.uint8))
    assert torch.equal(h_mx.scale, want_h.scale)

    h_values = h_mx.dequantize(torch.bfloat16)
    _, want_rows, _ = mx_round_trip_triton(swiglu_forward_triton(h_values, p), False, True, False, torch.bfloat16)
    assert_same_bits(swiglu_along_rows_from_stored_triton(h_mx, p, torch.bfloat16), want_rows)
    got = swiglu_backward_mx_triton(h_mx, p, grad_a)
    want = swiglu_backward_mx_triton(h_values, p, grad_a)
    for got_tensor, want_tensor in zip(got[:2], want[:2]):
        assert_same_bits(got_tensor, want_tensor)
    assert_grad_p_close(got[2], want[2], h_values, grad_a)


@pytest.mark.parametrize("expert_rows", [96, 40])  # TMA; pointer stores and 8-row maxima
def test_fp8_group_column_kernels_match_torch(expert_rows):
    from foldmill.moe.kernels.fp8_quant import quantize_group_columns_triton, quantize_weight_columns_triton
    from foldmill.moe.quant.fp8 import quantize_group_columns, quantize_rowwise

    generator = torch.Generator().manual_seed(5)
    sizes = [64, 0, 112, 48]
    x = torch.cat([torch.randn(s, 200, generator=generator) * 10.0 ** (g - 2) for g, s in enumerate(sizes)]).bfloat16()
    ends = torch.tensor(sizes).cumsum(0).to(torch.int32)
    data, scale = quantize_group_columns_triton(x.to(CUDA), ends.to(CUDA))
    want_data, want_scale = quantize_group_columns(x, ends)
    assert torch.allclose(scale.cpu(), want_scale, rtol=1e-6, atol=0)
    got, want = data.cpu().float(), want_data.float()
    assert float((got - want).abs().max()) <= float(want.abs().max()) * 2**-3
    weight = (torch.randn(3, expert_rows, 64, generator=generator) * torch.linspace(0.01, 10, 64)).bfloat16()
    data, scale = quantize_weight_columns_triton(weight.to(CUDA))
    want_data, want_scale = quantize_rowwise(weight.transpose(-2, -1))
    assert torch.allclose(scale.cpu(), want_scale, rtol=1e-6, atol=0)
    assert float((data.cpu().float() - want_data.float()).abs().max()) <= 448 * 2**-3


@pytest.mark.parametrize("padding_rows", [16, 8])  # the transposed copy stored by TMA; by pointers
def test_fp8_combined_quantizer_matches_the_separate_kernels(padding_rows):
    from foldmill.moe.kernels.fp8_quant import (
        quantize_group_columns_triton,
        quantize_rows_and_group_columns_triton,
        quantize_rowwise_triton,
        quantize_weight_columns_triton,
        quantize_weight_copies_triton,
    )

    generator = torch.Generator().manual_seed(8)
    sizes = [64, 0, 112, 48, 1040]
    x = torch.cat([torch.randn(s, 200, generator=generator) * 10.0 ** (g - 2) for g, s in enumerate(sizes)])
    x = torch.cat([x, torch.randn(padding_rows, 200, generator=generator)]).bfloat16().to(CUDA)
    ends = torch.tensor(sizes).cumsum(0).to(torch.int32).to(CUDA)
    end = int(ends[-1])
    # Freed NaNs of the row scales' size: the allocator hands that block to the quantizer, so a row
    # scale it fails to write shows.
    torch.full((x.shape[0],), float("nan"), device=CUDA)
    (row_data, row_scale), (data, scale) = quantize_rows_and_group_columns_triton(x, ends)
    want_rows, want_row_scale = quantize_rowwise_triton(x)
    want_data, want_scale = quantize_group_columns_triton(x, ends)
    assert torch.equal(row_data[:end].view(torch.uint8), want_rows[:end].view(torch.uint8))
    assert torch.equal(row_scale[:end], want_row_scale[:end])
    assert torch.equal(row_scale[end:], torch.zeros(padding_rows, device=CUDA))  # rows past the groups
    assert torch.equal(data[:, :end].view(torch.uint8), want_data[:, :end].view(torch.uint8))
    assert torch.equal(scale, want_scale)
    weight = (torch.randn(3, 96, 200, generator=generator) * torch.linspace(0.01, 10, 200)).bfloat16().to(CUDA)
    (forward, forward_scale), (dgrad, dgrad_scale) = quantize_weight_copies_triton(weight)
    want_forward, want_forward_scale = quantize_rowwise_triton(weight)
    want_dgrad, want_dgrad_scale = quantize_weight_columns_triton(weight)
    assert torch.equal(forward.view(torch.uint8), want_forward.view(torch.uint8))
    assert torch.equal(forward_scale, want_forward_scale)
    assert torch.equal(dgrad.view(torch.uint8), want_dgrad.view(torch.uint8))
    assert torch.equal(dgrad_scale, want_dgrad_scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_adamw_kernel_with_clip_factor_matches_torch_clipping_and_adamw(dtype):
    from foldmill.moe.train.optim import AdamW

    torch.manual_seed(9)
    shapes = [(3, 257, 129), (4099,), (64, 64)]
    ours = [torch.nn.Parameter(torch.randn(shape, device=CUDA).to(dtype)) for shape in shapes]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]

    def groups(params):
        return [{"params": params[:2], "weight_decay": 0.1}, {"params": params[2:], "weight_decay": 0.0}]

    optimizer = AdamW(groups(ours), lr=1e-2, betas=(0.9, 0.95), fused=True)
    reference = torch.optim.AdamW(groups(theirs), lr=1e-2, betas=(0.9, 0.95), fused=True)
    for step in range(4):
        for a, b in zip(ours, theirs):
            a.grad = torch.randn_like(a) * (3.0 if step % 2 else 1e-3)  # clipped on odd steps only
            b.grad = a.grad.clone()
        norm = torch.nn.utils.get_total_norm([p.grad for p in ours])
        optimizer.step(grad_scale=(1.0 / (norm + 1e-6)).clamp(max=1.0))
        torch.nn.utils.clip_grad_norm_(theirs, 1.0)
        reference.step()
    eps = torch.finfo(dtype).eps
    for a, b in zip(ours, theirs):
        # The same float32 update, rounded differently by an ulp or so on each of the 4 steps.
        updated, expected = a.detach().float(), b.detach().float()
        assert float((updated - expected).abs().max()) <= 8 * eps * float(expected.abs().max())
        assert torch.equal(optimizer.state[a]["step"], reference.state[b]["step"])
        state, want = optimizer.state[a]["exp_avg_sq"].float(), reference.state[b]["exp_avg_sq"].float()
        assert float((state - want).abs().max()) <= 4 * eps * float(want.abs().max())


def test_fp8_weight_gradient_gemm_matches_emulation_with_an_empty_group():
    from foldmill.moe.experts.fp8_rowwise import Fp8RowwiseGemm
    from foldmill.moe.quant.fp8 import quantize_group_columns

    generator = torch.Generator().manual_seed(6)
    sizes = [64, 0, 112, 48]
    dy = torch.cat([torch.randn(s, 256, generator=generator) * 10.0 ** (g - 2) for g, s in enumerate(sizes)])
    x = torch.randn(dy.shape[0], 128, generator=generator)
    ends = torch.tensor(sizes).cumsum(0).to(torch.int32)
    gemm = Fp8RowwiseGemm(fast_accumulation=True)
    on_gpu = (dy.bfloat16().to(CUDA), x.bfloat16().to(CUDA), ends.to(CUDA))
    got = gemm.wgrad(quantize_group_columns(on_gpu[0], on_gpu[2]), quantize_group_columns(on_gpu[1], on_gpu[2]),
                     on_gpu[2], torch.bfloat16)
    want = gemm.wgrad(quantize_group_columns(dy.bfloat16(), ends), quantize_group_columns(x.bfloat16(), ends), ends,
                      torch.bfloat16)
    assert torch.count_nonzero(got[1]) == 0
    for group in (0, 2, 3):
        assert float((got[group].cpu().float() - want[group].float()).norm() / want[group].float().norm()) < 1e-2


def test_weight_copies_follow_fused_adamw_steps():
    from foldmill.moe.experts.fp8_rowwise import Fp8RowwiseGemm

    torch.manual_seed(7)
    weight = torch.nn.Parameter(torch.randn(2, 64, 128, device=CUDA, dtype=torch.bfloat16) * 0.1)
    x = torch.randn(64, 128, device=CUDA, dtype=torch.bfloat16)
    ends = torch.tensor([32, 64], dtype=torch.int32, device=CUDA)
    gemm = Fp8RowwiseGemm(fast_accumulation=True)
    before, _ = gemm.forward(x, weight, ends)
    optimizer = torch.optim.AdamW([weight], lr=0.05, fused=True)
    weight.grad = torch.randn_like(weight)
    optimizer.step()
    after, _ = gemm.forward(x, weight, ends)
    fresh, _ = Fp8RowwiseGemm(fast_accumulation=True).forward(x, weight, ends)
    assert torch.equal(after, fresh) and not torch.equal(after, before)


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 10,
    reason="the native block-scaled MXFP8 route needs compute capability 10+",
)
def test_block_scaled_route_matches_emulation():
    from foldmill.moe.experts.mxfp8 import MXFP8Gemm, gemm_route

    generator = torch.Generator().manual_seed(8)
    x, dy = torch.randn(96, 64, generator=generator), torch.randn(96, 128, generator=generator)
    w = torch.randn(3, 128, 64, generator=generator)
    ends = torch.tensor([32, 32, 96], dtype=torch.int32)
    assert gemm_route(x.to(CUDA)) == "block_scaled"
    y, saved = MXFP8Gemm().forward(x.to(CUDA), w.to(CUDA), ends.to(CUDA))
    want, want_saved = MXFP8Gemm().forward(x, w, ends)
    assert float((y.cpu() - want).norm() / want.norm()) < 1e-3
    dx, dw = MXFP8Gemm().backward(dy.to(CUDA), w.to(CUDA), saved, ends.to(CUDA))
    want_dx, want_dw = MXFP8Gemm().backward(dy, w, want_saved, ends)
    assert float((dx.cpu() - want_dx).norm() / want_dx.norm()) < 1e-3
    assert float((dw.cpu() - want_dw).norm() / want_dw.norm()) < 1e-3


@pytest.mark.parametrize("per_record", [False, True])
def test_rope_kernel_matches_eager_rotation_and_its_gradient(per_record):
    from foldmill.moe.kernels.rope import apply_rope_triton
    from foldmill.moe.model.rope import rope_tables

    generator = torch.Generator().manual_seed(11)
    batch, seq, heads, head_dim = 2, 96, 6, 64
    cos, sin = rope_tables(head_dim, 128, 10000.0)
    if per_record:  # positions restarting at 0, 40 and 70 in the first window
        positions = torch.stack([torch.cat([torch.arange(40), torch.arange(30), torch.arange(26)]), torch.arange(seq)])
        cos, sin = cos[positions], sin[positions]
    else:
        cos, sin = cos[:seq], sin[:seq]
    x = torch.randn(batch, seq, heads, head_dim, generator=generator, dtype=torch.float64)
    grad = torch.randn(batch, seq, heads, head_dim, generator=generator, dtype=torch.float64)
    reference = x.clone().requires_grad_()
    c, s = (cos.unsqueeze(-2), sin.unsqueeze(-2)) if per_record else (cos.unsqueeze(1), sin.unsqueeze(1))
    first, second = reference.chunk(2, dim=-1)
    want = reference * c.double() + torch.cat([-second, first], dim=-1) * s.double()
    want.backward(grad)
    on_gpu = x.float().to(CUDA).requires_grad_()
    got = apply_rope_triton(on_gpu, cos.to(CUDA), sin.to(CUDA))
    got.backward(grad.float().to(CUDA))
    assert torch.allclose(got.detach().cpu().double(), want.detach(), atol=1e-5)
    assert torch.allclose(on_gpu.grad.cpu().double(), reference.grad, atol=1e-5)
    # bf16 in, bf16 out: one rounding of the float32 rotation.
    got_bf16 = apply_rope_triton(x.bfloat16().to(CUDA), cos.to(CUDA), sin.to(CUDA)).cpu().double()
    assert float((got_bf16 - want.detach()).abs().max()) <= float(want.detach().abs().max()) * 2**-7


@pytest.mark.parametrize("backend", ["grouped", "fp8_rowwise", "mxfp8", QUACK])
@pytest.mark.parametrize("masked", [False, True])
def test_captured_steps_train_as_eager_steps(backend, masked):
    """moe.cuda_graphs: replayed forward + backward steps give the eager run's losses and weights,
    and eager code after the replays (evaluation) reads 8-bit copies of the current weights."""
    from foldmill.moe.config import ModelConfig
    from foldmill.moe.model.decoder import MoEDecoder

    torch.manual_seed(0)
    config = ModelConfig(hidden_size=128, ffn_size=256, expert_backend=backend)
    eager = MoEDecoder(config).to(CUDA, torch.bfloat16)
    batches = torch.randint(4, config.vocab_size, (4, 2, 129), device=CUDA)
    documents = torch.arange(128, device=CUDA).div(40, rounding_mode="floor").expand(2, -1) if masked else None

    def loss(model, batch):
        logits = model(batch[:, :-1], documents).logits
        return (F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten()),)

    graphed, captured = assert_captured_steps_train_as_eager(eager, loss, batches)
    with torch.no_grad():
        assert torch.allclose(loss(graphed, batches[0])[0], loss(eager, batches[0])[0], rtol=1e-3, atol=0)
    with pytest.raises(ValueError, match="batches of shape"):
        captured(batches[0][:1])


def next_token_loss(model, batch):
    """(cross-entropy of `model`'s next-token logits on `batch`,): the captured steps' loss_fn."""
    logits = model(batch[:, :-1]).logits
    return (F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten()),)


def assert_captured_steps_train_as_eager(eager, loss, batches, micro_batches=1):
    """Train a copy of `eager` with captured steps and `eager` itself with eager steps, torch's AdamW
    after each, over `batches` (each step's split into `micro_batches`): the same losses and weights.
    Returns the copy and its captured step."""
    import copy

    from foldmill.moe.train.graphs import CapturedForwardBackward
    from foldmill.moe.train.loss import accumulate_gradients

    graphed = copy.deepcopy(eager)
    eager_optimizer = torch.optim.AdamW(eager.parameters(), lr=1e-2, fused=True)
    graphed_optimizer = torch.optim.AdamW(graphed.parameters(), lr=1e-2, fused=True)
    captured = CapturedForwardBackward(graphed, lambda batch: loss(graphed, batch), micro_batches)
    for batch in batches:
        want = accumulate_gradients(lambda part: loss(eager, part), batch, micro_batches)[0]
        eager_optimizer.step()
        eager_optimizer.zero_grad(set_to_none=True)
        got = captured(batch)[0]
        graphed_optimizer.step()
        assert torch.allclose(got, want, rtol=1e-3, atol=0)
    for (name, p), q in zip(eager.named_parameters(), graphed.parameters()):
        assert torch.allclose(p.float(), q.float(), rtol=1e-2, atol=1e-4), name
    return graphed, captured


@pytest.mark.parametrize("backend", ["grouped", "fp8_rowwise", "mxfp8", QUACK])
def test_captured_steps_of_micro_batches_train_as_eager_accumulation(backend):
    """moe.gradient_accumulation_steps: one graph runs the passes of a step's micro-batches (the 8-bit
    weight copies made once) and sums their gradients as eager passes do."""
    from foldmill.moe.config import ModelConfig
    from foldmill.moe.model.decoder import MoEDecoder

    torch.manual_seed(0)
    config = ModelConfig(hidden_size=128, ffn_size=256, expert_backend=backend)
    eager = MoEDecoder(config).to(CUDA, torch.bfloat16)
    batches = torch.randint(4, config.vocab_size, (4, 6, 129), device=CUDA)
    _, captured = assert_captured_steps_train_as_eager(eager, next_token_loss, batches, micro_batches=3)
    assert captured.static_batch.shape == (6, 129)


@pytest.mark.parametrize("backend", ["grouped", "fp8_rowwise", "mxfp8"])
def test_captured_bf16_mixed_steps_with_bf16_experts_match_float32_experts(backend):
    """bf16-mixed in one process (train/precision.py): captured steps whose AdamW kernel updates
    float32 masters from bf16 gradients and writes the bf16 weights give, bit for bit, the masters
    the float32 weights of the recipe that casts them on every pass reach, and their rounding."""
    import copy

    from foldmill.moe.config import ModelConfig
    from foldmill.moe.model.decoder import MoEDecoder
    from foldmill.moe.parallel.gradients import clip_factor
    from foldmill.moe.train.graphs import CapturedForwardBackward
    from foldmill.moe.train.loss import autocast
    from foldmill.moe.train.optim import AdamW
    from foldmill.moe.train.precision import prepare_parameters

    torch.manual_seed(0)
    config = ModelConfig(hidden_size=128, ffn_size=256, expert_backend=backend)
    cast_each_pass = MoEDecoder(config).to(CUDA)
    stored_in_bf16 = copy.deepcopy(cast_each_pass)
    masters = prepare_parameters(stored_in_bf16, "bf16-mixed")
    batches = torch.randint(4, config.vocab_size, (4, 2, 129), device=CUDA)

    def steps(model, master_weights):
        def loss(batch):
            with autocast(CUDA, "bf16-mixed"):
                logits = model(batch[:, :-1]).logits
            return (F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten()),)

        optimizer = AdamW(model.parameters(), lr=1e-2, fused=True, master_weights=master_weights)
        captured = CapturedForwardBackward(model, loss)
        losses = []
        for batch in batches:
            losses.append(captured(batch)[0])
            # A norm past any the gradients reach: the factor is exactly 1 on both sides. (The
            # norm's float32 partials are summed per dtype, so their order differs between the two.)
            optimizer.step(grad_scale=clip_factor(model, 1e9)[1])
        return torch.stack(losses), optimizer

    want_losses, reference = steps(cast_each_pass, None)
    got_losses, optimizer = steps(stored_in_bf16, masters)
    assert torch.equal(got_losses, want_losses)
    for (name, want), got in zip(cast_each_pass.named_parameters(), stored_in_bf16.parameters()):
        if got in masters:
            assert torch.equal(masters[got], want) and torch.equal(got, want.bfloat16()), name
            assert torch.equal(optimizer.state[got]["exp_avg_sq"], reference.state[want]["exp_avg_sq"]), name
        else:
            assert torch.equal(got, want), name


@pytest.mark.parametrize("backend, micro_batches", [("grouped", 1), ("fp8_rowwise", 1), ("fp8_rowwise", 2)])
def test_trainer_with_cuda_graphs_trains_and_resumes_as_eager(tmp_path, data_dir, backend, micro_batches):
    """The pretraining loop with moe.cuda_graphs (the default): same losses as eager, evaluation and checkpoints
    between replays, and a resumed run that captures again from the checkpoint; with gradient
    accumulation too."""
    import json

    from foldmill.moe.config import TrainConfig
    from foldmill.moe.data.corpus import prepare_corpus
    from foldmill.moe.train.trainer import Trainer

    corpus = tmp_path / "corpus"
    prepare_corpus([data_dir / "proteomes/yeast_chr1.fasta"], corpus, val_fraction=0.05)
    settings = {"steps": 8, "batch_size": 4 // micro_batches, "gradient_accumulation_steps": micro_batches,
                "seq_len": 64, "lr": 5e-3, "warmup_steps": 2, "log_every": 2, "checkpoint_every": 4, "eval_every": 4,
                "eval_batches": 2, "precision": "bf16", "expert_backend": backend}
    eager = Trainer(corpus, tmp_path / "eager", TrainConfig(**settings, cuda_graphs=False)).fit()
    graphed = Trainer(corpus, tmp_path / "graphed", TrainConfig(**settings, cuda_graphs=True)).fit()
    assert graphed["final_train_loss"] == pytest.approx(eager["final_train_loss"], rel=1e-2)
    assert graphed["val_loss"] == pytest.approx(eager["val_loss"], rel=1e-2)
    # Resume the graphed run from its step-4 checkpoint and train to step 8 again.
    resumed_dir = tmp_path / "resumed"
    (resumed_dir / "checkpoints").mkdir(parents=True)
    import shutil

    shutil.copytree(tmp_path / "graphed/checkpoints/step_00000004", resumed_dir / "checkpoints/step_00000004")
    resumed = Trainer(corpus, resumed_dir, TrainConfig(**settings, cuda_graphs=True)).fit()
    assert resumed["steps"] == 8
    assert resumed["val_loss"] == pytest.approx(graphed["val_loss"], rel=1e-2)
    losses = [json.loads(line) for line in (tmp_path / "graphed/metrics.jsonl").read_text().splitlines()]
    assert len([line for line in losses if "val_loss" in line]) == 2  # step 4 and the end
    # MFU against this GPU's spec peaks (null where none is known), FP8 experts also against FP8's.
    from foldmill.moe.train.metrics import spec_peaks

    peaks = spec_peaks(torch.cuda.get_device_name())
    logged = [line for line in losses if "tokens_per_second_per_gpu" in line]
    columns = {"mfu": "bf16", "mfu_fp8": "fp8"} if backend == "fp8_rowwise" else {"mfu": "bf16"}
    assert logged and all(set(columns) <= set(line) for line in logged)
    for column, precision in columns.items():
        for line in logged:
            if precision in peaks:
                assert line[column] == pytest.approx(
                    line["mfu"] * peaks["bf16"] / peaks[precision], rel=1e-9) and 0 < line[column] < 1
            else:
                assert line[column] is None


@pytest.mark.parametrize("backend", ["grouped", "fp8_rowwise"])
def test_captured_ddp_steps_replay_ddps_gradient_reduction(backend):
    """Under DDP (over a process group of this process alone), a captured step holds DDP's gradient
    reduction: with a communication hook that doubles what it all-reduces, every replay's gradients
    are twice a plain model's over the same two micro-batches, reduced once (under no_sync before
    the last micro-batch; reduced after each, the first micro-batch's would count four times)."""
    import copy

    import torch.distributed as dist

    from foldmill.moe.config import ModelConfig
    from foldmill.moe.model.decoder import MoEDecoder
    from foldmill.moe.train.distributed import Dist, one_process_group, wrap_model
    from foldmill.moe.train.graphs import CapturedForwardBackward, built_on_capture_stream
    from foldmill.moe.train.loss import accumulate_gradients

    device = torch.device("cuda", torch.cuda.current_device())
    torch.manual_seed(0)
    config = ModelConfig(hidden_size=128, ffn_size=256, expert_backend=backend)
    plain = MoEDecoder(config).to(device, torch.bfloat16)
    batches = torch.randint(4, config.vocab_size, (3, 4, 129), device=device)

    def doubled_all_reduce(state, bucket):
        work = dist.all_reduce(bucket.buffer().mul_(2), async_op=True)
        return work.get_future().then(lambda future: future.value()[0])

    with one_process_group(device):
        ddp, stream = built_on_capture_stream(lambda: wrap_model(copy.deepcopy(plain), "ddp", Dist(0, 1, device)),
                                              device)
        ddp.register_comm_hook(None, doubled_all_reduce)
        captured = CapturedForwardBackward(ddp, lambda batch: next_token_loss(ddp, batch), micro_batches=2,
                                           stream=stream)
        for batch in batches:
            got = captured(batch)[0]
            want = accumulate_gradients(lambda part: next_token_loss(plain, part), batch, 2)[0]
            assert torch.allclose(got, want, rtol=1e-3, atol=0)
            for (name, p), q in zip(plain.named_parameters(), ddp.module.parameters()):
                assert torch.allclose(q.grad.float(), 2 * p.grad.float(), rtol=1e-2, atol=1e-5), name
            plain.zero_grad(set_to_none=True)
    with pytest.raises(ValueError, match="built_on_capture_stream"):
        CapturedForwardBackward(ddp, lambda batch: next_token_loss(ddp, batch))


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_data_parallel_trainer_captures_its_steps_and_trains_as_eager_ddp(tmp_path, data_dir, micro_batches):
    """With a process group the trainer wraps the model in DDP; moe.cuda_graphs then captures each
    step with DDP's all-reduces: the eager DDP run's losses, with evaluation and checkpoints between
    replays."""
    from foldmill.moe.config import TrainConfig
    from foldmill.moe.data.corpus import prepare_corpus
    from foldmill.moe.train.distributed import Dist, one_process_group
    from foldmill.moe.train.trainer import Trainer

    device = torch.device("cuda", torch.cuda.current_device())
    corpus = tmp_path / "corpus"
    prepare_corpus([data_dir / "proteomes/yeast_chr1.fasta"], corpus, val_fraction=0.05)
    settings = {"steps": 6, "batch_size": 4 // micro_batches, "gradient_accumulation_steps": micro_batches,
                "seq_len": 64, "lr": 5e-3, "warmup_steps": 2, "log_every": 2, "checkpoint_every": 3, "eval_every": 3,
                "eval_batches": 2, "precision": "bf16", "expert_backend": "fp8_rowwise", "parallel": "ddp"}
    with one_process_group(device):
        env = Dist(0, 1, device)
        eager = Trainer(corpus, tmp_path / "eager", TrainConfig(**settings, cuda_graphs=False), env)
        graphed = Trainer(corpus, tmp_path / "graphed", TrainConfig(**settings, cuda_graphs=True), env)
        assert isinstance(graphed.model, torch.nn.parallel.DistributedDataParallel)
        assert eager.captured is None and graphed.captured is not None
        want, got = eager.fit(), graphed.fit()
    assert got["final_train_loss"] == pytest.approx(want["final_train_loss"], rel=1e-2)
    assert got["val_loss"] == pytest.approx(want["val_loss"], rel=1e-2)


def test_bench_gives_cublas_workspaces_back_between_rows():
    """cuBLAS takes a workspace from torch's cache for each new stream it runs on (every captured
    step row warms up on another side stream); the bench returns them before each row."""
    from foldmill.bench.moe import _clear_cublas_workspaces

    a = torch.randn(256, 256, device=CUDA)
    a @ a
    _clear_cublas_workspaces()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    for _ in range(3):
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            a @ a
        torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() > before
    _clear_cublas_workspaces()
    assert torch.cuda.memory_allocated() == before


def test_bench_host_rows_count_the_kernels_an_eager_step_launches():
    """`--sections host`: per backend, the eager step's GPU and host times and the kernels it
    launches, of which the Triton ones; the FP8 quantizers and MXFP8 copies are Triton kernels the
    bf16 step does not launch. Then each step under DDP over one process, eager and captured."""
    from foldmill.bench.moe import bench_step

    backends = ["grouped", "fp8_rowwise", "mxfp8"]
    rows = bench_step("tiny", 0, 512, 256, backends, repeats=3, peaks={}, host=True)
    ddp_rows = [f"foldmill {backend}, DDP over one process{graphed}" for backend in backends
                for graphed in ("", ", CUDA graph")]
    assert [row["variant"] for row in rows] == [f"foldmill {backend}" for backend in backends] + ddp_rows
    for row in rows:
        assert "error" not in row, row
        assert row["section"] == "host" and row["ms"] > 0 and row["host_ms"] > 0
        if not row["variant"].endswith("CUDA graph"):
            assert 0 < row["triton_kernels_per_step"] < row["kernels_per_step"]
    grouped, fp8, mxfp8 = rows[:3]
    assert fp8["triton_kernels_per_step"] > grouped["triton_kernels_per_step"]
    assert mxfp8["triton_kernels_per_step"] > grouped["triton_kernels_per_step"]
    assert grouped["speedup_vs_foldmill_grouped"] == 1.0
    for plain, ddp, captured in zip(rows[:3], rows[3::2], rows[4::2]):
        assert ddp["kernels_per_step"] >= plain["kernels_per_step"]  # DDP's hooks may add copies
        assert ddp["triton_kernels_per_step"] == plain["triton_kernels_per_step"]
        assert "kernels_per_step" not in captured  # a replay launches none from Python
    import torch.distributed as dist

    assert not dist.is_initialized()  # the rows' process group is gone


@pytest.mark.parametrize(("backend", "settings"), [("mxfp8", {}), ("mxfp8", {"mxfp8_store_swiglu_input": True}),
                                                   ("fp8_rowwise", {})],
                         ids=["mxfp8", "mxfp8 storing the SwiGLU input", "fp8_rowwise"])
def test_weight_copies_made_per_gemm_give_the_bits_of_the_kept_copies(backend, settings):
    """moe.keep_weight_copies: false makes each GEMM's copy of its weight in that GEMM (one
    layout per launch) instead of both layouts once per step: the output and every gradient keep
    their bits."""
    from foldmill.moe.experts import get_backend
    from foldmill.moe.experts.mlp import grouped_swiglu_experts

    torch.manual_seed(7)
    ends = torch.tensor([256, 512, 800, 1024], dtype=torch.int32, device=CUDA)
    operands = (torch.randn(1024, 256, device=CUDA, dtype=torch.bfloat16), torch.rand(1024, device=CUDA),
                torch.randn(4, 1024, 256, device=CUDA, dtype=torch.bfloat16) / 16,
                torch.randn(4, 256, 512, device=CUDA, dtype=torch.bfloat16) / 22)
    grad_y = torch.randn(1024, 256, device=CUDA, dtype=torch.bfloat16)

    def output_and_gradients(gemm):
        leaves = [t.clone().requires_grad_() for t in operands]
        y = grouped_swiglu_experts(*leaves, ends, gemm)
        y.backward(grad_y)
        return [y.detach()] + [leaf.grad for leaf in leaves]

    kept = output_and_gradients(get_backend(backend, **settings))
    per_gemm = output_and_gradients(get_backend(backend, keep_weight_copies=False, **settings))
    for name, want, got in zip(("y", "x", "probs", "w13", "w2"), kept, per_gemm):
        assert torch.equal(got, want), name
    assert kept[3].abs().sum() > 0 and kept[4].abs().sum() > 0
