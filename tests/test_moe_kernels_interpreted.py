"""The MoE kernels of the bf16-mixed path under Triton's CPU interpreter, reached through the model's
own dispatch: RMSNorm.add_and_norm (the fused add + RMSNorm kernel on a float32 stream taking a bf16
delta) and the experts' to_compute_dtype (a cast whose gradient runs the upcast kernel). The kernels
run in a child process (kernel_testing.run_interpreted), where the modules' use_triton answers yes
for CPU tensors. GPU parity, the bf16 stream included, is in test_moe_gpu.py (the interpreter rounds
float32 to bf16 its own way, so bf16 outputs are not compared here)."""

from __future__ import annotations

import pytest
import torch
from kernel_testing import HAS_TRITON, relative_error, rms_norm_fp64, run_interpreted, serve_cases

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")

ROWS, COLS = 7, 96  # 96 columns: the kernel masks its 128-wide block


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


def _run_case(case: dict, dtype: torch.dtype) -> dict:
    """Child process (TRITON_INTERPRET=1): one case through the model's dispatch."""
    from foldmill.moe.model import moe, norm

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


if __name__ == "__main__":
    serve_cases(_run_case)
