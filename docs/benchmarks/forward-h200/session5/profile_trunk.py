"""Where the trunk's time goes: per sub-module GPU time (CUDA events on forward hooks), a kernel table,
and a LayerNorm bandwidth check. Device only (session 5 profiling; results go to docs)."""

import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

from foldmill import kernels
from foldmill.bench._inputs import get_features, parse_inputs
from foldmill.kernels.padding import pad_token_features
from foldmill.model.boltz2 import Boltz2
from foldmill.model.config import Boltz2Config
from foldmill.model.demo import randomize_weights
from foldmill.model.fastpath import TRAINING_ONLY_FEATURES, FastBoltz2

out_dir = Path(sys.argv[1])
out_dir.mkdir(parents=True, exist_ok=True)
device = torch.device("cuda")
model = Boltz2(Boltz2Config())
randomize_weights(model, 0)
fast = FastBoltz2(model.eval(), device=device)
print("runner built, allocated GiB", round(torch.cuda.memory_allocated() / 2**30, 2), flush=True)


def hooks(root: torch.nn.Module, events: dict) -> list:
    handles = []
    stacks = {"pairformer": fast.network.pairformer_module.stack, "msa": fast.network.msa_module}
    for stack_name, stack in stacks.items():
        for layer in stack.layers:
            for child_name, child in layer.named_children():
                key = f"{stack_name}.{child_name}"

                def pre(_m, _a, key=key):
                    e = torch.cuda.Event(enable_timing=True)
                    e.record()
                    events["open"][key] = e

                def post(_m, _a, _o, key=key):
                    e = torch.cuda.Event(enable_timing=True)
                    e.record()
                    events["pairs"][key].append((events["open"].pop(key), e))

                handles += [child.register_forward_pre_hook(pre), child.register_forward_hook(post)]
    return handles


def trunk_once(feats):
    with kernels.kernel_policy(enabled=True), torch.no_grad():
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            return fast.network.trunk(feats, 0, fast.options.residual_dtype)


report = {}
for spec in sys.argv[2].split(","):
    item = parse_inputs(spec)[0]
    features = get_features(item, Path(sys.argv[3]), device)
    features = {k: v for k, v in features.items() if k not in TRAINING_ONLY_FEATURES}
    feats, _ = pad_token_features(features, 8)
    trunk_once(feats)  # autotune, first calls
    torch.cuda.synchronize()
    events = {"open": {}, "pairs": defaultdict(list)}
    handles = hooks(fast.network, events)
    start = time.perf_counter()
    trunk_once(feats)
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    for h in handles:
        h.remove()
    per_op = {k: round(sum(a.elapsed_time(b) for a, b in v), 1) for k, v in events["pairs"].items()}
    report[spec] = {"trunk_pass_wall_s": round(wall, 3), "per_submodule_ms": dict(sorted(per_op.items(), key=lambda kv: -kv[1]))}
    print(spec, json.dumps(report[spec]), flush=True)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        trunk_once(feats)
        torch.cuda.synchronize()
    (out_dir / f"kernels_{spec}.txt").write_text(
        prof.key_averages().table(sort_by="cuda_time_total", row_limit=45, max_name_column_width=110)
    )
    del feats, features
    torch.cuda.empty_cache()

# LayerNorm bandwidth at 1,024 tokens: fp32 pair in, bf16 out (the trunk's case), vs an fp32 add.
from foldmill.kernels.triton_layer_norm_kernel import fused_layer_norm
from foldmill.model.layers.layer_norm import layer_norm_in_compute_dtype
from foldmill.runtime.timing import cuda_median_ms

x = torch.randn(1, 1024, 1024, 128, device=device)
w, b = torch.randn(128, device=device), torch.randn(128, device=device)
y = torch.randn_like(x)
with torch.autocast("cuda", dtype=torch.bfloat16):
    ln = {
        "triton_ms": cuda_median_ms(lambda: fused_layer_norm(x, w, b, 1e-5, torch.bfloat16), 20, warmup=3),
        "torch_ms": cuda_median_ms(lambda: layer_norm_in_compute_dtype(x, w, b, 1e-5), 20, warmup=3),
        "triton_transposed_ms": cuda_median_ms(
            lambda: fused_layer_norm(x.transpose(1, 2), w, b, 1e-5, torch.bfloat16), 20, warmup=3
        ),
    }
ln["fp32_add_ms"] = cuda_median_ms(lambda: x + y, 20, warmup=3)
ln["bytes_ln"] = x.numel() * 6
report["layer_norm_1024"] = ln
print(json.dumps(ln), flush=True)
(out_dir / "trunk_profile.json").write_text(json.dumps(report, indent=1))
