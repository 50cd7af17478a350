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

from foldmill.moe.experts.routing import plan_routing
from foldmill.moe.quant.mx import quantize_mx
from foldmill.moe.quant.mx_reference import quantize_mx_reference
from test_moe_quant import adversarial

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


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
    a, a_q = swiglu_forward_triton(h, p, quantize=True)
    gate, up = h.float().chunk(2, dim=-1)
    expected = (F.silu(gate) * up * p[:, None]).bfloat16()
    assert float((a.float() - expected.float()).abs().max()) <= 2 ** -7 * float(expected.float().abs().max())
    reference = quantize_mx(a)
    assert torch.equal(a_q.data.view(torch.uint8), reference.data.view(torch.uint8))
    assert torch.equal(a_q.scale, reference.scale)
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


@pytest.mark.parametrize(("backend", "tolerance"), [("loop", 1e-2), ("grouped", 1e-2), ("fp8_rowwise", 0.1), ("mxfp8", 0.1)])
def test_backend_layer_matches_fp32_reference_on_gpu(backend, tolerance):
    from test_moe_experts import compare_with_reference

    compare_with_reference(backend, CUDA, torch.bfloat16, tolerance, hidden=256, ffn=512, tokens=2048)
