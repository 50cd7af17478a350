"""Session 13 device micro-benchmark (issue 6), in one process:

1. The pair and MSA transitions with the residual added in the kernel (residual_out) against the
   update followed by a separate add, as session 12's code ran them: the pair by blocks of token rows
   (pair_transition_rows), the MSA track whole. Also each narrow block config of the in-place kernel.
2. The triangle multiplication's output kernel (with the residual, as the trunk runs it) at block
   configs with register caps and software-pipeline stages, and persistent programs per SM: at 255
   registers only two of its programs fit on an SM.

1 x N x N x 128 fp32 pair, 1 x 2,048 x N x 64 fp32 MSA, bf16, median ms of 7 after 2 warm-ups.
Usage (device): python3 kernel_configs.py OUT_DIR 1704,2472
Ran at e1b4ba5 (lease 1), whose transition took residual_out (reverted in 642c657): check that commit out
to run it again.
"""

import json
import sys
from pathlib import Path

import torch

from foldmill.kernels import triton_triangle_multiplication_kernel as trimul
from foldmill.kernels.triton_transition_kernel import NARROW_CONFIGS, fused_transition
from foldmill.model.layers.pairformer import pair_transition_rows
from foldmill.runtime.timing import cuda_median_ms

OUTPUT_VARIANTS = [  # (block_p, warps, stages, register cap, programs per SM)
    (32, 4, 1, None, 4),  # shipped
    (32, 4, 1, None, 2),
    (32, 4, 1, 168, 3),
    (32, 4, 1, 168, 4),
    (32, 4, 1, 128, 4),
    (32, 4, 2, None, 4),
    (32, 4, 2, 168, 3),
    (32, 8, 1, None, 4),
    (16, 4, 1, None, 4),
    (16, 4, 1, 128, 6),
]


def transition_weights(dim: int, device: torch.device, g: torch.Generator) -> list[torch.Tensor]:
    s = dim**-0.5
    return [
        1 + 0.2 * torch.randn(dim, generator=g, device=device), 0.2 * torch.randn(dim, generator=g, device=device),
        (torch.randn(4 * dim, dim, generator=g, device=device) * s).bfloat16(),
        (torch.randn(4 * dim, dim, generator=g, device=device) * s).bfloat16(),
        (torch.randn(dim, 4 * dim, generator=g, device=device) * (4 * dim) ** -0.5).bfloat16(),
    ]  # fmt: skip


def transitions(n: int, device: torch.device, results: list) -> None:
    g = torch.Generator(device=device).manual_seed(n)
    w = transition_weights(128, device, g)
    z = torch.randn(1, n, n, 128, generator=g, device=device)
    rows = pair_transition_rows(n, 128) or n

    def separate(z=z):
        for start in range(0, n, rows):
            z[:, start : start + rows] += fused_transition(z[:, start : start + rows], *w, 1e-5, torch.bfloat16)

    def fused(z=z, config=None):
        for start in range(0, n, rows):
            block = z[:, start : start + rows]
            fused_transition(block, *w, 1e-5, torch.bfloat16, config, residual_out=block)

    with torch.no_grad():
        check = z[:, :rows].clone()
        expected = check + fused_transition(check, *w, 1e-5, torch.bfloat16)
        fused_transition(check, *w, 1e-5, torch.bfloat16, residual_out=check)
        row = {"tokens": n, "op": "pair_transition", "rows_per_call": rows, "max_diff": float((check - expected).abs().max())}
        row["separate_add_ms"] = round(cuda_median_ms(separate, repeats=7, warmup=2), 3)
        row["residual_in_kernel_ms"] = round(cuda_median_ms(fused, repeats=7, warmup=2), 3)
        for config in NARROW_CONFIGS:
            key = f"residual_{config.block_m}x{config.block_h}x{config.num_warps}_ms"
            row[key] = round(cuda_median_ms(lambda: fused(config=config), repeats=7, warmup=2), 3)
        print(json.dumps(row), flush=True)
        results.append(row)
        del z, check, expected
        wm = transition_weights(64, device, g)
        m = torch.randn(1, 2048, n, 64, generator=g, device=device)
        row = {"tokens": n, "op": "msa_transition", "msa_rows": 2048}
        row["separate_add_ms"] = round(cuda_median_ms(lambda: m + fused_transition(m, *wm, 1e-5, torch.bfloat16), 7, warmup=2), 3)
        row["residual_in_kernel_ms"] = round(
            cuda_median_ms(lambda: fused_transition(m, *wm, 1e-5, torch.bfloat16, residual_out=m), 7, warmup=2), 3
        )
        print(json.dumps(row), flush=True)
        results.append(row)
        del m
    torch.cuda.empty_cache()


def output_kernel(n: int, device: torch.device, results: list) -> None:
    g = torch.Generator(device=device).manual_seed(n + 1)
    x = torch.randn(1, n, n, 128, generator=g, device=device)
    s = 128**-0.5
    norm = [1 + 0.2 * torch.randn(128, generator=g, device=device), 0.2 * torch.randn(128, generator=g, device=device)]
    p_out, g_out = ((torch.randn(128, 128, generator=g, device=device) * s).bfloat16() for _ in range(2))
    product = torch.randn((128, n, n), generator=g, device=device).bfloat16()
    own = x.clone()
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    flags = {"DOT_PRECISION": "tf32", "EMULATE_BF16": False}
    reference = None
    for block_p, warps, stages, cap, per_sm in OUTPUT_VARIANTS:
        config = trimul.BlockConfig(block_p, warps, stages, cap)
        out = x.clone()

        def launch(out=out, config=config, per_sm=per_sm):
            args = (product, x, out, *norm, *norm, p_out, g_out, n, 1, *x.stride()[:3], *out.stride()[:3], 1e-5)
            trimul._launch(trimul._gated_output_kernel, min(sms * per_sm, n), config, *args, C=128, RESIDUAL=True, **flags)

        row = {"tokens": n, "op": "trimul_output", "config": [block_p, warps, stages, cap], "programs_per_sm": per_sm}
        try:
            launch()
            if reference is None:
                reference = out.clone()
            row["max_diff_vs_shipped"] = float((out - reference).abs().max())
            row["ms"] = round(cuda_median_ms(lambda: launch(own), repeats=7, warmup=2), 3)
        except Exception as error:  # a config that does not compile or launch: recorded, the sweep goes on
            row["error"] = f"{type(error).__name__}: {str(error)[:200]}"
        print(json.dumps(row), flush=True)
        results.append(row)
        del out
    del x, product, own
    torch.cuda.empty_cache()


def main(out_dir: Path, sizes: list[int]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda")
    results: list = []
    for n in sizes:
        transitions(n, device, results)
        output_kernel(n, device, results)
    (out_dir / "kernel_configs.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), [int(x) for x in sys.argv[2].split(",")])
