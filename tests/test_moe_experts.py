"""Expert backends against an fp64 reference MoE (forward and every gradient), and routing plans.

Tolerances (relative Frobenius norm): loop/grouped in fp32 ~1e-6 (1e-5 asserted); bf16 <= 1e-2;
8-bit recipes <= 0.1 — E4M3 keeps 3 mantissa bits (relative rounding <= 2^-4 per element), and each
output goes through two quantized GEMMs (each quantizing both operands), so ~3-6% is expected.
"""

from __future__ import annotations

import dataclasses
import re
import sys

import pytest
import torch
import torch.nn.functional as F
from kernel_testing import relative_error

from foldmill.moe.config import ModelConfig, TrainConfig
from foldmill.moe.experts.routing import permute_tokens, plan_routing, unpermute_tokens
from foldmill.moe.model.moe import MoEBlock


def reference_moe(x, gate_weight, w13, w2, experts):
    """fp64 MoE given the chosen experts (tokens, top_k): renormalized softmax weights, SwiGLU experts."""
    probs = (x @ gate_weight.t()).softmax(dim=-1)
    chosen = probs.gather(1, experts)
    chosen = chosen / chosen.sum(dim=-1, keepdim=True)
    ffn = w2.shape[2]
    out = torch.zeros_like(x)
    for slot in range(experts.shape[1]):
        h = torch.einsum("th,tfh->tf", x, w13[experts[:, slot]])
        a = F.silu(h[:, :ffn]) * h[:, ffn:]
        out = out + chosen[:, slot, None] * torch.einsum("tf,thf->th", a, w2[experts[:, slot]])
    return out


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    return float((got - want).norm() / want.norm())


def compare_with_reference(backend, device, dtype, tolerance, hidden=64, ffn=128, tokens=96, experts=4, **fields):
    """Assert forward and all gradients of the backend's MoE block (ModelConfig `fields` applied) are
    within `tolerance` of fp64."""
    torch.manual_seed(0)
    config = ModelConfig(hidden_size=hidden, ffn_size=ffn, num_experts=experts, top_k=2, expert_backend=backend,
                         **fields)
    block = MoEBlock(config)
    for parameter in block.parameters():
        torch.nn.init.normal_(parameter, std=0.5 / hidden**0.5)
    block = block.to(device=device, dtype=dtype)
    x = torch.randn(tokens, hidden, device=device, dtype=dtype).requires_grad_()
    grad_out = torch.randn(tokens, hidden, device=device, dtype=dtype)
    out = block(x).hidden
    out.backward(grad_out)
    chosen = block.router(x.detach()).experts.cpu()

    names = ["router.gate.weight", "experts.gate_up_proj", "experts.down_proj"]
    params = {n: dict(block.named_parameters())[n].detach().double().cpu().requires_grad_() for n in names}
    x_ref = x.detach().double().cpu().requires_grad_()
    want = reference_moe(x_ref, *params.values(), chosen)
    want.backward(grad_out.double().cpu())
    errors = {"output": relative(out, want), "x": relative(x.grad, x_ref.grad)}
    for name in names:
        errors[name] = relative(dict(block.named_parameters())[name].grad, params[name].grad)
    assert max(errors.values()) < tolerance, errors
    return errors


@pytest.mark.parametrize("backend", ["loop", "grouped", "quack"])
def test_bf16_free_backends_match_reference_in_fp32(backend):
    compare_with_reference(backend, torch.device("cpu"), torch.float32, 1e-5)


@pytest.mark.parametrize(("backend", "fields"), [("fp8_rowwise", {}), ("mxfp8", {}),
                                               ("mxfp8", {"mxfp8_store_swiglu_input": True})],
                         ids=["fp8_rowwise", "mxfp8", "mxfp8 storing the SwiGLU input"])
def test_8bit_backends_match_reference_within_format_error(backend, fields):
    errors = compare_with_reference(backend, torch.device("cpu"), torch.float32, 0.1, **fields)
    # The 8-bit path really quantized: an fp32 path would be ~1e-7 from the reference.
    assert errors["output"] > 1e-3


@pytest.mark.parametrize(("backend", "multiple"), [("mxfp8", 32), ("fp8_rowwise", 16)])
def test_8bit_backends_refuse_expert_sizes_they_cannot_block(backend, multiple):
    """The MXFP8 kernels (SwiGLU included) block the FFN dimension by 32, the FP8 GEMMs align it by 16:
    a config that cannot be blocked is refused up front, in one line naming the sizes."""
    from foldmill.errors import FoldmillError

    with pytest.raises(FoldmillError, match=rf"^expert backend {backend} needs hidden_size and ffn_size "
                                            rf"divisible by {multiple}, got 64 and 104$"):
        ModelConfig(hidden_size=64, num_heads=4, num_kv_heads=2, ffn_size=104, expert_backend=backend)
    ModelConfig(hidden_size=64, num_heads=4, num_kv_heads=2, ffn_size=128, expert_backend=backend)


def test_mxfp8_store_swiglu_input_reaches_the_backend_and_is_refused_where_it_cannot_apply():
    """moe.mxfp8_store_swiglu_input travels from the training config to the MXFP8 backend; with
    another backend, or with recompute_experts (which keeps less), it is refused in one line."""
    from foldmill.errors import FoldmillError
    from foldmill.moe.train.trainer import build_model_config

    model_config = build_model_config(
        TrainConfig(expert_backend="mxfp8", mxfp8_store_swiglu_input=True), vocab_size=32)
    assert MoEBlock(model_config).experts.backend.store_swiglu_input is True
    assert MoEBlock(ModelConfig(expert_backend="mxfp8")).experts.backend.store_swiglu_input is False
    for backend, recompute in (("grouped", False), ("mxfp8", True)):
        with pytest.raises(FoldmillError, match=(
                "^mxfp8_store_swiglu_input needs expert_backend mxfp8 and recompute_experts off "
                rf"\(recomputing keeps less\), got expert_backend {backend} and recompute_experts "
                f"{str(recompute).lower()}$")):
            ModelConfig(expert_backend=backend, recompute_experts=recompute, mxfp8_store_swiglu_input=True)


@pytest.mark.parametrize("backend", ["fp8_rowwise", "mxfp8"])
def test_keep_weight_copies_reaches_the_8bit_backends_and_is_refused_elsewhere(backend):
    """moe.keep_weight_copies: false travels from the training config to the 8-bit backends (no
    cache of weight copies); with a backend that makes none it is refused in one line."""
    from foldmill.errors import FoldmillError
    from foldmill.moe.train.trainer import build_model_config

    model_config = build_model_config(TrainConfig(expert_backend=backend, keep_weight_copies=False), vocab_size=32)
    assert MoEBlock(model_config).experts.backend.weights is None
    assert MoEBlock(ModelConfig(expert_backend=backend)).experts.backend.weights is not None
    for other in ("loop", "grouped", "quack"):
        with pytest.raises(FoldmillError, match="^keep_weight_copies: false needs an 8-bit expert_backend "
                                                rf"\(fp8_rowwise or mxfp8\), got {other}$"):
            ModelConfig(expert_backend=other, keep_weight_copies=False)


@pytest.mark.parametrize("fast", [True, False])
def test_fp8_accumulation_setting_reaches_the_backend(fast):
    """moe.fp8_fast_accumulation travels from the training config to the FP8 backend's GEMM calls
    (the GPU test checks the kernel receives it; the emulation here accumulates in fp32 either way)."""
    from foldmill.moe.train.trainer import build_model_config

    model_config = build_model_config(
        TrainConfig(expert_backend="fp8_rowwise", fp8_fast_accumulation=fast), vocab_size=32)
    assert MoEBlock(model_config).experts.backend.fast_accumulation is fast
    compare_with_reference("fp8_rowwise", torch.device("cpu"), torch.float32, 0.1, fp8_fast_accumulation=fast)


def test_backends_agree_with_each_other_on_cpu():
    torch.manual_seed(1)
    config = ModelConfig(hidden_size=64, ffn_size=96, num_experts=8, top_k=2)
    x = torch.randn(2, 40, 64)
    outputs = {}
    for backend in ("loop", "grouped", "mxfp8"):
        torch.manual_seed(2)
        block = MoEBlock(dataclasses.replace(config, expert_backend=backend))
        for parameter in block.parameters():
            torch.nn.init.normal_(parameter, std=0.1)
        outputs[backend] = block(x).hidden
    assert relative(outputs["grouped"], outputs["loop"]) < 1e-6
    assert 1e-3 < relative(outputs["mxfp8"], outputs["loop"]) < 0.1


def gradients_with_and_without_recompute(backend, device, dtype, hidden=64, ffn=128, tokens=96):
    """{recompute: (output, x.grad, parameter grads)} of one MoE block, same weights and inputs, and
    {recompute: number of values the forward saved for the backward through autograd}."""
    results, saved = {}, {}
    for recompute in (False, True):
        torch.manual_seed(0)
        config = ModelConfig(hidden_size=hidden, ffn_size=ffn, num_experts=4, top_k=2, expert_backend=backend,
                             recompute_experts=recompute)
        block = MoEBlock(config).to(device=device, dtype=dtype)
        for parameter in block.parameters():
            torch.nn.init.normal_(parameter, std=0.5 / hidden**0.5)
        x = torch.randn(tokens, hidden, device=device, dtype=dtype).requires_grad_()
        saved[recompute] = 0

        def count(tensor: torch.Tensor, key: bool = recompute) -> torch.Tensor:
            saved[key] += tensor.numel()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(count, lambda tensor: tensor):
            out = block(x).hidden
        out.backward(torch.randn_like(out))
        results[recompute] = [out, x.grad] + [p.grad for p in block.parameters()]
    return results, saved


@pytest.mark.parametrize("backend", ["loop", "grouped", "fp8_rowwise", "mxfp8", "quack"])
def test_recomputed_expert_hidden_gives_the_same_gradients(backend):
    """moe.recompute_experts runs the first expert GEMM again in the backward: same operands, same
    kernels, so every gradient is bit-identical to keeping its output."""
    results, saved = gradients_with_and_without_recompute(backend, torch.device("cpu"), torch.float32)
    for kept, recomputed in zip(results[False], results[True]):
        assert torch.equal(kept, recomputed)
    assert results[True][1].abs().sum() > 0
    # The first GEMM's output (rows x 2F = 256) is no longer kept, its input (rows x 64) is: 192 rows,
    # or more where the backend pads each expert's group. quack keeps x through autograd either way.
    rows, remainder = divmod(saved[False] - saved[True], 256 if backend == "quack" else 256 - 64)
    assert remainder == 0 and rows >= 192


def test_routing_plan_pads_groups_and_round_trips_tokens():
    torch.manual_seed(3)
    experts = torch.randint(0, 5, (37, 2))
    experts[:, 1] = (experts[:, 0] + 1 + torch.randint(0, 4, (37,))) % 5  # distinct experts per token
    plan = plan_routing(experts, 5, 32)
    counts = torch.bincount(experts.flatten(), minlength=5)
    sizes = torch.diff(plan.group_ends.long(), prepend=torch.zeros(1, dtype=torch.long))
    assert torch.equal(plan.tokens_per_expert, counts)
    assert torch.all(sizes % 32 == 0) and torch.all(sizes >= counts) and torch.all(sizes < counts + 32)
    assert plan.rows % 32 == 0 and plan.rows >= int(plan.group_ends[-1])
    # each (token, slot) row lies inside its expert's group
    starts = plan.group_ends.long() - sizes
    rows = plan.slot_rows
    assert torch.all(rows >= starts[experts]) and torch.all(rows < plan.group_ends.long()[experts])
    x = torch.randn(37, 8, requires_grad=True)
    probs = torch.rand(37, 2, requires_grad=True)
    permuted, row_probs = permute_tokens(x, probs, plan)
    assert torch.equal(permuted[rows[:, 1]], x.detach())
    assert int((plan.source_slots < 0).sum()) == plan.rows - 74 and torch.all(permuted[plan.source_slots < 0] == 0)
    back = unpermute_tokens(permuted * row_probs[:, None], plan)
    assert torch.allclose(back, x * probs.sum(dim=1, keepdim=True))
    back.sum().backward()
    assert torch.allclose(x.grad, probs.detach().sum(dim=1, keepdim=True).expand(-1, 8))
    assert torch.allclose(probs.grad, x.detach().sum(dim=1, keepdim=True).expand(-1, 2))


def test_router_gradient_splits_exactly_into_three_bf16_terms():
    """The tensor-core router's backward feeds the float32 logit gradient to bf16 GEMMs as three
    terms; their sum must be the gradient itself (from 1e-25 to 1e30 here)."""
    from foldmill.moe.model.router import bf16_terms

    generator = torch.Generator().manual_seed(5)
    values = torch.randn(4096, 8, generator=generator) * torch.logspace(-25, 30, 8)
    terms = bf16_terms(values)
    assert all(term.dtype == torch.bfloat16 for term in terms)
    assert torch.equal(sum(term.double() for term in terms), values.double())
    assert not torch.equal(terms[0].double(), values.double())  # one or two terms would not do
    assert not torch.equal((terms[0].double() + terms[1].double()), values.double())


def _projections_and_gradients(x, weights, grads, autocast):
    from foldmill.moe.model.projections import project

    x = x.clone().requires_grad_()
    weights = [weight.clone().requires_grad_() for weight in weights]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        outputs = project(x, weights)
    torch.autograd.backward(outputs, [grad.to(out.dtype) for grad, out in zip(grads, outputs)])
    return outputs, x.grad, [weight.grad for weight in weights]


@pytest.mark.parametrize("autocast", [False, True])
def test_shared_input_projections_give_separate_linears_and_their_summed_input_gradient(autocast):
    """Attention's q, k and v projections of one input: the outputs, the input's gradient (summed
    over the three) and each weight's gradient of the exact float64 formulas, to float32 rounding;
    under bf16 autocast the outputs are bf16 and the gradients keep the float32 dtypes of the input
    and the weights, to bf16 rounding of the operands."""
    torch.manual_seed(8)
    x = torch.randn(2, 24, 64)
    weights = [torch.randn(n, 64) * 0.1 for n in (64, 32, 32)]
    grads = [torch.randn(2, 24, n) for n in (64, 32, 32)]
    outputs, grad_x, grad_weights = _projections_and_gradients(x, weights, grads, autocast)
    dtype = torch.bfloat16 if autocast else torch.float32
    x64, weights64, grads64 = ([t.to(dtype).double() for t in ts] for ts in ([x], weights, grads))
    x64 = x64[0]
    tolerance = 1e-2 if autocast else 1e-6
    for out, weight64 in zip(outputs, weights64, strict=True):
        assert out.dtype == dtype and relative_error(out.detach(), x64 @ weight64.t()) < tolerance
    want_x = sum(grad64 @ weight64 for grad64, weight64 in zip(grads64, weights64))
    assert grad_x.dtype == torch.float32 and relative_error(grad_x, want_x) < tolerance
    for got, grad64 in zip(grad_weights, grads64, strict=True):
        want = grad64.reshape(-1, grad64.shape[-1]).t() @ x64.reshape(-1, 64)
        assert got.dtype == torch.float32 and relative_error(got, want) < tolerance


def test_router_decides_in_float32_under_bf16_autocast():
    """The bf16-mixed recipe runs the model under bf16 autocast, which would turn the router's float32
    GEMM into a bf16 one: the logits, the routing weights and their gradients must stay those of the
    float32 router."""
    from foldmill.moe.model.router import TopKRouter

    torch.manual_seed(6)
    router = TopKRouter(64, 8, 2)
    x = torch.randn(256, 64)
    results = []
    for autocast in (False, True):
        router.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            routing = router(x)
        (routing.weights * torch.arange(2.0)).sum().backward()
        results.append((routing.weights, routing.experts, router.gate.weight.grad.clone()))
    (weights, experts, grad), (mixed_weights, mixed_experts, mixed_grad) = results
    assert mixed_weights.dtype == torch.float32
    assert torch.equal(mixed_experts, experts)
    assert torch.equal(mixed_weights, weights)
    assert torch.equal(mixed_grad, grad)


@pytest.mark.parametrize("backend", ["fp8_rowwise", "mxfp8"])
def test_8bit_experts_under_autocast_quantize_each_cast_once_and_keep_nothing(backend, monkeypatch):
    """Under the bf16-mixed recipe the experts' weights are bf16 casts of fp32 masters, new on every
    forward pass: their 8-bit copies are made once per pass, shared by the forward and backward
    GEMMs, and let go with the cast (kept, they would hold a step's worth of copies and the cast's
    autograd graph into the next step)."""
    from foldmill.moe.experts import weights

    made = []
    real_get = weights.WeightCache.get

    def counting_get(self, tag, weight, make):
        return real_get(self, tag, weight, lambda w: made.append(tag) or make(w))

    monkeypatch.setattr(weights.WeightCache, "get", counting_get)
    torch.manual_seed(0)
    block = MoEBlock(ModelConfig(hidden_size=64, ffn_size=128, num_experts=4, top_k=2, expert_backend=backend))
    for parameter in block.parameters():
        torch.nn.init.normal_(parameter, std=0.1)
    x = torch.randn(96, 64, requires_grad=True)
    per_pass = None
    for step in range(2):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = block(x).hidden
        out.float().sum().backward()
        del out
        per_pass = per_pass or len(made)
        assert per_pass > 0 and len(made) == per_pass * (step + 1)  # no copy made twice within a pass
        assert len(block.experts.backend.weights) == 0


def test_quack_backend_names_a_cutlass_install_that_quack_would_refuse(monkeypatch):
    """QuACK keys CUTLASS's DSL by name only under a site-packages folder; installed elsewhere it
    raises a TypeError deep inside its own epilogues, so foldmill says so first, in one line; so
    too when QuACK is not installed at all."""
    from foldmill.moe.experts import quack_fused
    from foldmill.moe.experts.quack_fused import cutlass_location_problem

    monkeypatch.setattr(quack_fused, "quack_installed", lambda: False)
    quack_fused._quack_problem.cache_clear()
    try:
        assert quack_fused._quack_problem() == "expert backend quack needs QuACK on CUDA: pip install quack-kernels"
        # installed, but failing to import (CUTLASS's DSL missing or of another version)
        monkeypatch.setattr(quack_fused, "quack_installed", lambda: True)
        monkeypatch.setitem(sys.modules, "quack", None)
        quack_fused._quack_problem.cache_clear()
        problem = quack_fused._quack_problem()
        assert re.match(r"expert backend quack: QuACK is installed but does not import "
                        r"\((ModuleNotFound|Import)Error: ", problem)
        assert problem.endswith("reinstall quack-kernels and nvidia-cutlass-dsl together") and "\n" not in problem
    finally:
        quack_fused._quack_problem.cache_clear()

    for origin in (None, "/opt/conda/lib/python3.12/site-packages/nvidia_cutlass_dsl/dsl_packages/cutlass/__init__.py",
                   "/usr/lib/python3/dist-packages/cutlass/__init__.py"):
        assert cutlass_location_problem(origin) is None
    problem = cutlass_location_problem("/tmp/site/nvidia_cutlass_dsl/dsl_packages/cutlass/__init__.py")
    assert "/tmp/site/nvidia_cutlass_dsl" in problem and "--target" in problem and "\n" not in problem


def test_quack_tiles_are_pinned_per_gpu_where_measured():
    """The H100 and the H200 share sm_90 but not their fastest tiles: the H100's gated GEMMs keep
    QuACK's default (measured faster there), its dgated GEMMs take measured tiles, at Mixtral-8x7B's
    experts its plain GEMMs too, and no pin applies to a GPU or shape it was not measured on. Every
    pin names a GEMM the backend looks tiles up for."""
    from foldmill.moe.experts.quack_fused import MEASURED_TILES

    h100_mixtral = {(kernel, "NVIDIA H100 80GB HBM3", 4096, 14336) for kernel in ("dgated", "down", "grad_x", "grad_w13")}
    assert set(MEASURED_TILES) == {("gated", "NVIDIA H200", 2048, 4096), ("dgated", "NVIDIA H200", 2048, 4096),
                                   ("dgated", "NVIDIA H100 80GB HBM3", 2048, 4096)} | h100_mixtral
    assert {key[0] for key in MEASURED_TILES} <= {"gated", "dgated", "down", "grad_w2", "grad_x", "grad_w13"}
    assert all(set(tiles) == {"tile_m", "tile_n", "pingpong", "cluster_m", "cluster_n"}
               for tiles in MEASURED_TILES.values())
