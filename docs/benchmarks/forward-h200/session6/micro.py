"""Session 6 micro-benchmarks (device only): triangle multiplication cuEquivariance vs by_rows (time, peak,
agreement); flash triangle-attention block configs (first-call compile+run, steady time)."""

import json
import sys
import time
from pathlib import Path

import torch

from foldmill import kernels
from foldmill.model.layers import triangle_multiplication as tm

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
dev = torch.device("cuda")
report = {"trimul": [], "attention": []}


def timed(fn, reps=3):
    fn()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / reps


def peak_of(fn):
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = fn()
    torch.cuda.synchronize()
    return result, (torch.cuda.max_memory_allocated() - base) / 2**30


torch.manual_seed(0)
layer = tm.TriangleMultiplicationOutgoing(128).to(dev)
for p in layer.parameters():
    torch.nn.init.normal_(p, std=0.1)
weights = (layer.norm_in.weight, layer.norm_in.bias, layer.p_in.weight, layer.g_in.weight,
           layer.norm_out.weight, layer.norm_out.bias, layer.p_out.weight, layer.g_out.weight)
for n in [int(v) for v in sys.argv[2].split(",")]:
    x = torch.randn(1, n, n, 128, device=dev)
    mask = torch.ones(1, n, n, device=dev)
    row = {"tokens": n}
    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16, cache_enabled=False):
        for direction in ("outgoing", "incoming"):
            results = {}
            for name, fn in (
                ("cueq", lambda: kernels.cueq.triangle_multiplicative_update(x, direction, mask, *weights)),
                ("by_rows", lambda: tm.triangle_multiplicative_update_by_rows(x, direction, mask, *weights)),
            ):
                if name == "cueq" and n > 4096:
                    continue
                try:
                    value, peak = peak_of(fn)
                    results[name] = value.float()
                    row[f"{direction}_{name}_ms"] = round(timed(fn), 3)
                    row[f"{direction}_{name}_peak_gib"] = round(peak, 3)
                except torch.OutOfMemoryError as error:
                    row[f"{direction}_{name}"] = f"OOM {error}"[:200]
                torch.cuda.empty_cache()
            if len(results) == 2:
                a, b = results["cueq"], results["by_rows"]
                row[f"{direction}_rel_diff"] = round(((a - b).norm() / a.norm()).item(), 5)
            del results
    del x, mask
    torch.cuda.empty_cache()
    print(json.dumps(row), flush=True)
    report["trimul"].append(row)

from foldmill.kernels import triton_triangle_attention_kernel as tk

for n in [int(v) for v in sys.argv[3].split(",")]:
    h, d = 4, 32
    q = torch.randn(1, n, h, n, d, device=dev, dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    bias = torch.randn(1, 1, h, n, n, device=dev, dtype=torch.bfloat16)
    mask = torch.ones(1, n, 1, 1, n, device=dev, dtype=torch.bool)
    gate = torch.randn(1, n, n, h * d, device=dev, dtype=torch.bfloat16)
    row = {"tokens": n}
    for config in tk.candidates(d):
        name = f"{config.block_m}x{config.block_n}w{config.num_warps}s{config.num_stages}"
        call = lambda: tk.flash_triangle_attention(q, k, v, bias, mask, d**-0.5, torch.bfloat16, config=config, gate=gate)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        call()
        torch.cuda.synchronize()
        row[f"{name}_first_s"] = round(time.perf_counter() - t0, 2)
        row[f"{name}_ms"] = round(timed(call), 3)
    t0 = time.perf_counter()
    tk.flash_triangle_attention(q, k, v, bias, mask, d**-0.5, torch.bfloat16, gate=gate)
    torch.cuda.synchronize()
    row["autotuned_first_s"] = round(time.perf_counter() - t0, 2)
    row["autotuned_ms"] = round(timed(lambda: tk.flash_triangle_attention(q, k, v, bias, mask, d**-0.5, torch.bfloat16, gate=gate)), 3)
    print(json.dumps(row), flush=True)
    report["attention"].append(row)
    del q, k, v, bias, gate
    torch.cuda.empty_cache()
(out / "micro.json").write_text(json.dumps(report, indent=1))
