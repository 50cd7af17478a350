"""Triangle multiplication on the H200 (session 11): cuEquivariance's fused op against foldmill's Triton
backend, with and without the residual add, at the trunk's shapes (1 x N x N x 128, fp32 pair, bf16
autocast, the last N/16 tokens padding). Median ms of CUDA-event timings after warm-up; the Triton
backend's three launches timed apart; errors against the fp32 reference.

    python3 trimul_bench.py OUT_DIR 256,512,1024,1700,2472

As run (lease 1, calls 3 and 4), both times on code that was not committed as such: call 3 against the first,
non-persistent kernels (a program per tile), call 4 against the persistent ones, whose incoming product still
ran a_t^T @ b_t (commit de6d606 made the edges kernel read x's transpose instead) and whose launcher still had
an autotuner (`_launch(kernel, tuned, programs, config, ...)`; the configurations are pinned since).
"""

import json
import os
import sys
from pathlib import Path

import torch

from foldmill import kernels
from foldmill.kernels import triton_triangle_multiplication_kernel as tk
from foldmill.model.layers.triangle_multiplication import triangle_multiplicative_update
from foldmill.runtime.timing import cuda_median_ms

out_dir = Path(sys.argv[1])
out_dir.mkdir(parents=True, exist_ok=True)
sizes = [int(n) for n in sys.argv[2].split(",")]
device = torch.device("cuda")
report = {}


def inputs(n: int, seed: int = 0):
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(1, n, n, 128, generator=g, device=device)
    token_mask = torch.ones(1, n, device=device)
    token_mask[:, n - n // 16 :] = 0
    mask = token_mask[:, :, None] * token_mask[:, None, :]
    s = 128**-0.5
    weights = (1 + 0.2 * torch.randn(128, generator=g, device=device), 0.2 * torch.randn(128, generator=g, device=device),
               torch.randn(256, 128, generator=g, device=device) * s, torch.randn(256, 128, generator=g, device=device) * s,
               1 + 0.2 * torch.randn(128, generator=g, device=device), 0.2 * torch.randn(128, generator=g, device=device),
               torch.randn(128, 128, generator=g, device=device) * s, torch.randn(128, 128, generator=g, device=device) * s)
    return x, mask, weights


def relative_error(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


for n in sizes:
    row = {}
    for direction in ("outgoing", "incoming"):
        x, mask, weights = inputs(n)
        with torch.no_grad():
            expected = triangle_multiplicative_update(x, direction, mask, *weights)  # fp32 reference
        entry = {}
        own = x.clone()
        for backend in os.environ.get("CONTENDERS", "cueq,triton").split(","):
            for residual in (False, True):
                name = backend + ("+residual" if residual else "")

                def run(backend=backend, residual=residual):
                    with kernels.kernel_policy(force={"triangle_multiplication": backend}), torch.no_grad():
                        with torch.autocast("cuda", dtype=torch.bfloat16):
                            return kernels.dispatch("triangle_multiplication", triangle_multiplicative_update, x if not residual else own,
                                                    direction, mask, *weights, residual_out=own if residual else None)
                try:
                    if not residual:
                        out = run()
                        entry[f"{name} error"] = relative_error(out, expected)
                        del out
                    entry[f"{name} ms"] = round(cuda_median_ms(run, 7, warmup=2), 3)
                except Exception as error:  # noqa: BLE001
                    entry[f"{name} error"] = f"{type(error).__name__}: {error}"[:200]
                torch.cuda.empty_cache()
        # The Triton backend's parts alone.
        with torch.no_grad():
            flags = {"DOT_PRECISION": "tf32", "EMULATE_BF16": False}
            bf16 = torch.bfloat16
            p_in, g_in, p_out, g_out = (w.to(bf16).contiguous() for w in (weights[2], weights[3], weights[6], weights[7]))
            a_t = torch.empty((1, 128, n, n), device=device, dtype=bf16)
            b_t = torch.empty_like(a_t)

            def edges():
                tk._launch(tk._gated_edges_kernel, tk._autotuned_edges_kernel, tk.persistent_programs(device, 1, n), None, x, mask,
                           weights[0], weights[1], p_in, g_in, a_t, b_t, n, 1, *x.stride()[:3], *mask.stride(), 1e-5, C=128, **flags)

            def product():
                a, b = a_t.view(128, n, n), b_t.view(128, n, n)
                return torch.bmm(a, b.mT) if direction == "outgoing" else torch.bmm(a.mT, b)

            prod = product()

            def output():
                tk._launch(tk._gated_output_kernel, tk._autotuned_output_kernel, tk.persistent_programs(device, 1, n), None, prod, x,
                           own, weights[0], weights[1], weights[4], weights[5], p_out, g_out, n, 1, *x.stride()[:3], *own.stride()[:3],
                           1e-5, C=128, RESIDUAL=True, **flags)

            entry["triton parts ms (edges, bmm, output+residual)"] = [round(cuda_median_ms(f, 7, warmup=2), 3) for f in (edges, product, output)]
            if n == max(sizes) and direction == "outgoing":  # persistent programs per SM
                for per_sm in (1, 2, 8):
                    tk.PROGRAMS_PER_SM = per_sm
                    entry[f"edges, output ms at {per_sm} programs/SM"] = [round(cuda_median_ms(f, 7, warmup=2), 3) for f in (edges, output)]
                tk.PROGRAMS_PER_SM = 4
            entry["bmm TFLOP/s"] = round(2 * 128 * n**3 / entry["triton parts ms (edges, bmm, output+residual)"][1] / 1e9, 1)
            del a_t, b_t, prod
        row[direction] = entry
        print(n, direction, json.dumps(entry), flush=True)
        del x, own, expected
        torch.cuda.empty_cache()
    report[n] = row
report["autotuned"] = {name: str(kernel.best_config) for name, kernel in
                       (("edges", tk._autotuned_edges_kernel), ("output", tk._autotuned_output_kernel))}
print(json.dumps(report["autotuned"]))
(out_dir / "trimul_bench.json").write_text(json.dumps(report, indent=1))
