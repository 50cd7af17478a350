"""Session 12 device profile (issue 6): where one trunk pairformer block's GPU time goes, by sub-module
(CUDA events on forward hooks, the median call over 3 blocks: a module called several times per block,
the pair transition by rows, shows one call; so `outside_submodules_ms` over-counts it) and by kernel (torch profiler, one call), at the given
token counts. The block is the fast path's own (FastBoltz2 on the full-size demo model: bf16 weights,
fp32 pair), run as the trunk runs it (bf16 autocast, z updated in place); the last N/64 tokens padding.

Usage (device): python3 pair_block_profile.py OUT_DIR 1672,2472
"""

import json
import statistics
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from foldmill import kernels
from foldmill.model.config import Boltz2Config
from foldmill.model.demo import demo_model
from foldmill.model.fastpath import FastBoltz2


def main(out_dir: Path, sizes: list[int]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda")
    fast = FastBoltz2(demo_model(Boltz2Config(), device=device), device=device)
    stack = fast.network.pairformer_module
    layer = getattr(stack, "stack", stack).layers[0]
    report = {}
    for tokens in sizes:
        generator = torch.Generator(device=device).manual_seed(tokens)
        s = torch.randn(1, tokens, 384, device=device, generator=generator)
        z = torch.randn(1, tokens, tokens, 128, device=device, generator=generator)
        mask = (torch.arange(tokens, device=device) < tokens - tokens // 64).float()[None]
        pair_mask = mask[:, :, None] * mask[:, None, :]

        def block() -> None:
            with kernels.kernel_policy(enabled=True), torch.no_grad():
                with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
                    layer(s, z, mask, pair_mask, 128, in_place=True)

        block()
        block()
        torch.cuda.synchronize()
        times: dict[str, list[float]] = {}
        opened: dict[str, torch.cuda.Event] = {}
        handles = []
        for name, child in layer.named_children():
            def pre(_m, _a, name=name):
                opened[name] = torch.cuda.Event(enable_timing=True)
                opened[name].record()

            def post(_m, _a, _o, name=name):
                end = torch.cuda.Event(enable_timing=True)
                end.record()
                times.setdefault(name, []).append((opened.pop(name), end))

            handles += [child.register_forward_pre_hook(pre), child.register_forward_hook(post)]
        totals = []
        for _ in range(3):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            block()
            end.record()
            torch.cuda.synchronize()
            totals.append(start.elapsed_time(end))
        for handle in handles:
            handle.remove()
        per_module = {
            name: round(statistics.median(a.elapsed_time(b) for a, b in pairs), 3) for name, pairs in times.items()
        }
        report[tokens] = {"block_ms": round(statistics.median(totals), 3), "per_submodule_ms": per_module}
        report[tokens]["outside_submodules_ms"] = round(report[tokens]["block_ms"] - sum(per_module.values()), 3)
        print(tokens, json.dumps(report[tokens]), flush=True)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            block()
            torch.cuda.synchronize()
        table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=110)
        (out_dir / f"kernels_{tokens}.txt").write_text(table)
        print(table[:6000], flush=True)
        del s, z, mask, pair_mask
        torch.cuda.empty_cache()
    (out_dir / "pair_block_profile.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), [int(x) for x in sys.argv[2].split(",")])
