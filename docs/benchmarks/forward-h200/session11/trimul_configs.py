"""The Triton triangle multiplication's two kernels at pinned block configurations (session 11), at one
size (1 x N x N x 128, fp32 pair, bf16), and the whole backend in both directions. Median ms of 7.

    python3 trimul_configs.py OUT_DIR 2472

As run (lease 1, call 5) at commit 8c9f80b, whose `_launch` still took an autotuner argument (None here).
"""

import itertools
import json
import sys
from pathlib import Path

import torch

from foldmill import kernels
from foldmill.kernels import triton_triangle_multiplication_kernel as tk
from foldmill.model.layers.triangle_multiplication import triangle_multiplicative_update
from foldmill.runtime.timing import cuda_median_ms

out_dir, n = Path(sys.argv[1]), int(sys.argv[2])
out_dir.mkdir(parents=True, exist_ok=True)
device = torch.device("cuda")
g = torch.Generator(device=device).manual_seed(0)
x = torch.randn(1, n, n, 128, generator=g, device=device)
mask = torch.ones(1, n, n, device=device)
s = 128**-0.5
w = [1 + 0.2 * torch.randn(128, generator=g, device=device), 0.2 * torch.randn(128, generator=g, device=device),
     torch.randn(256, 128, generator=g, device=device) * s, torch.randn(256, 128, generator=g, device=device) * s,
     1 + 0.2 * torch.randn(128, generator=g, device=device), 0.2 * torch.randn(128, generator=g, device=device),
     torch.randn(128, 128, generator=g, device=device) * s, torch.randn(128, 128, generator=g, device=device) * s]
bf16 = torch.bfloat16
p_in, g_in, p_out, g_out = (t.to(bf16).contiguous() for t in (w[2], w[3], w[6], w[7]))
a_t = torch.empty((1, 128, n, n), device=device, dtype=bf16)
b_t = torch.empty_like(a_t)
prod = torch.empty((128, n, n), device=device, dtype=bf16)
own = x.clone()
flags = {"DOT_PRECISION": "tf32", "EMULATE_BF16": False}
report = {}
for (block_p, warps), stages, per_sm in itertools.product(((32, 4), (64, 4), (64, 8), (128, 8)), (1, 2, 3), (4,)):
    config = tk.BlockConfig(block_p, warps, stages)
    tk.PROGRAMS_PER_SM = per_sm
    programs = tk.persistent_programs(device, 1, n)
    row = {}
    for name, kernel, args in (
        ("edges", tk._gated_edges_kernel, (x, mask, w[0], w[1], p_in, g_in, a_t, b_t, n, 1, *x.stride()[:3], *mask.stride(), 1e-5)),
        ("output", tk._gated_output_kernel, (prod, x, own, w[0], w[1], w[4], w[5], p_out, g_out, n, 1, *x.stride()[:3], *own.stride()[:3], 1e-5)),
    ):
        extra = {"RESIDUAL": True} if name == "output" else {}
        try:
            row[name] = round(cuda_median_ms(lambda: tk._launch(kernel, None, programs, config, *args, C=128, **extra, **flags), 7, warmup=1), 3)
        except Exception as error:  # noqa: BLE001 - out of resources etc.
            row[name] = type(error).__name__
    report[f"{block_p}x{warps}w s{stages} {per_sm}/SM"] = row
    print(block_p, warps, stages, per_sm, row, flush=True)
tk.PROGRAMS_PER_SM = 4
for direction in ("outgoing", "incoming"):
    def run(direction=direction):
        with kernels.kernel_policy(force={"triangle_multiplication": "triton"}), torch.no_grad(), torch.autocast("cuda", dtype=bf16):
            return kernels.dispatch("triangle_multiplication", triangle_multiplicative_update, own, direction, mask, *w, residual_out=own)
    report[f"backend {direction} with residual"] = round(cuda_median_ms(run, 7, warmup=2), 3)
    print(direction, report[f"backend {direction} with residual"], flush=True)
(out_dir / "trimul_configs.json").write_text(json.dumps(report, indent=1))
