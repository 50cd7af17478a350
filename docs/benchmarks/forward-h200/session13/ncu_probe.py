"""Session 13 device probe (issue 6): one launch each of the flash triangle-attention kernel, the triangle
multiplication's output kernel and the in-place pair transition at N tokens, inside a profiler range
(cudaProfilerStart/Stop) for Nsight Compute: what bounds each (L2 and DRAM throughput, issue activity,
pipe use, warp stalls). Each runs once before the range (compilation, autotuning).

Usage (device): ncu --profile-from-start off --clock-control none --section ... python3 ncu_probe.py 2472
Ran at e1b4ba5 (lease 1), whose transition took residual_out (reverted in 642c657): check that commit out
to run it again.
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "session9"))
from attention_variants import DIM, inputs  # noqa: E402

from foldmill.kernels import triton_triangle_attention_kernel as attention  # noqa: E402
from foldmill.kernels import triton_triangle_multiplication_kernel as trimul  # noqa: E402
from foldmill.kernels.triton_transition_kernel import fused_transition  # noqa: E402


def main(tokens: int) -> None:
    device = torch.device("cuda")
    _, q, k, v, bias, mask, gate, _ = inputs(tokens)
    config = attention.NARROW_CONFIGS[0]

    def attend():
        return attention.flash_triangle_attention(q, k, v, bias, mask, DIM**-0.5, torch.bfloat16, config, gate=gate)

    g = torch.Generator(device=device).manual_seed(tokens)
    x = torch.randn(1, tokens, tokens, 128, generator=g, device=device)
    norm = [1 + 0.2 * torch.randn(128, generator=g, device=device), 0.2 * torch.randn(128, generator=g, device=device)]
    p_out, g_out = ((torch.randn(128, 128, generator=g, device=device) * 128**-0.5).bfloat16() for _ in range(2))
    product = torch.randn((128, tokens, tokens), generator=g, device=device).bfloat16()
    programs = trimul.persistent_programs(device, 1, tokens)
    output_args = (product, x, x, *norm, *norm, p_out, g_out, tokens, 1, *x.stride()[:3], *x.stride()[:3], 1e-5)
    flags = {"DOT_PRECISION": "tf32", "EMULATE_BF16": False}

    def output():
        trimul._launch(trimul._gated_output_kernel, programs, trimul.OUTPUT_CONFIG, *output_args, C=128, RESIDUAL=True, **flags)

    fc = [(torch.randn(512, 128, generator=g, device=device) * 128**-0.5).bfloat16() for _ in range(2)]
    fc.append((torch.randn(128, 512, generator=g, device=device) * 512**-0.5).bfloat16())
    block = x[:, :191]

    def transition():
        fused_transition(block, *norm, *fc, 1e-5, torch.bfloat16, residual_out=block)

    with torch.no_grad():
        for run in (attend, output, transition):
            run()
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        for run in (attend, output, transition):
            run()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    print("probe done", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))
