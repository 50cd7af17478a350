"""Where one trunk pass's time goes at a given size: GPU time per sub-module of every pair block
(CUDA events on forward hooks) and a kernel table. Device only (session 8; results go to docs).

    python3 profile_trunk.py OUT_DIR 2x1234@2048 FEATURES_DIR
"""

import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from foldmill import kernels
from foldmill.bench._inputs import get_features, parse_inputs
from foldmill.kernels.padding import pad_token_features
from foldmill.model.boltz2 import Boltz2
from foldmill.model.config import Boltz2Config
from foldmill.model.demo import randomize_weights
from foldmill.model.fastpath import FastBoltz2

out_dir = Path(sys.argv[1])
out_dir.mkdir(parents=True, exist_ok=True)
device = torch.device("cuda")
model = Boltz2(Boltz2Config())
randomize_weights(model, 0)
fast = FastBoltz2(model.eval(), device=device)


def add_hooks(events: dict) -> list:
    network = fast.network
    stacks = {
        "pairformer": network.pairformer_module.stack if hasattr(network.pairformer_module, "stack") else network.pairformer_module,
        "msa": network.msa_module,
    }
    modules = {}
    for stack_name, stack in stacks.items():
        for layer in stack.layers:
            for child_name, child in layer.named_children():
                modules.setdefault(f"{stack_name}.{child_name}", []).append(child)
                if child_name == "pairformer_layer":
                    for grand_name, grand in child.named_children():
                        modules.setdefault(f"msa.pairformer_layer.{grand_name}", []).append(grand)
    for name in ("template_module", "msa_module", "input_embedder"):
        if hasattr(network, name):
            modules[name] = [getattr(network, name)]
    handles = []
    for key, items in modules.items():
        for module in items:

            def pre(_m, _a, key=key, module=module):
                event = torch.cuda.Event(enable_timing=True)
                event.record()
                events["open"][id(module)] = event

            def post(_m, _a, _o, key=key, module=module):
                event = torch.cuda.Event(enable_timing=True)
                event.record()
                events["pairs"][key].append((events["open"].pop(id(module)), event))

            handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
    return handles


def trunk_once(feats: dict, recycles: int = 0):
    with kernels.kernel_policy(enabled=True), torch.no_grad():
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            return fast.network.trunk(feats, recycles, fast.options.residual_dtype)


report = {}
for spec in sys.argv[2].split(","):
    item = parse_inputs(spec)[0]
    features = get_features(item, Path(sys.argv[3]), device)
    feats, _ = pad_token_features(features, 8)
    trunk_once(feats)  # first calls: compilation
    torch.cuda.synchronize()
    events = {"open": {}, "pairs": defaultdict(list)}
    handles = add_hooks(events)
    start = time.perf_counter()
    trunk_once(feats)
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    for handle in handles:
        handle.remove()
    per_module = {k: round(sum(a.elapsed_time(b) for a, b in v), 1) for k, v in events["pairs"].items()}
    report[spec] = {
        "trunk_pass_wall_s": round(wall, 3),
        "msa_rows": int(features["msa"].shape[1]),
        "per_submodule_ms": dict(sorted(per_module.items(), key=lambda kv: -kv[1])),
        "kernel_calls": kernels.chosen_counts(),
    }
    print(spec, json.dumps(report[spec]), flush=True)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        trunk_once(feats)
        torch.cuda.synchronize()
    (out_dir / f"kernels_{spec}.txt").write_text(
        prof.key_averages().table(sort_by="cuda_time_total", row_limit=60, max_name_column_width=120)
    )
    del feats, features
    torch.cuda.empty_cache()
(out_dir / "trunk_profile.json").write_text(json.dumps(report, indent=1))
