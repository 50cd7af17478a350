"""Session 8, device only. (1) The outer-product-mean op: reference vs the Triton backend (each block
config) at the throughput sample's sizes with 2,048 MSA rows, and its error against float64 math.
(2) Whether a pair block slows down under sustained load: one block at 2,472 tokens timed call by call
over ~10 s, after an idle pause (run beside `nvidia-smi` sampling clocks and power).

    python3 opm_and_clocks.py OUT_DIR
"""

import json
import sys
import time
from pathlib import Path

import torch

from foldmill import kernels
from foldmill.kernels import triton_outer_product
from foldmill.kernels.triton_outer_product_kernel import CONFIGS
from foldmill.model.boltz2 import Boltz2
from foldmill.model.config import Boltz2Config
from foldmill.model.demo import randomize_weights
from foldmill.model.fastpath import FastBoltz2
from foldmill.model.layers.outer_product_mean import outer_product_mean_update
from foldmill.runtime.timing import cuda_median_ms

out_dir = Path(sys.argv[1])
out_dir.mkdir(parents=True, exist_ok=True)
device = torch.device("cuda")
report: dict = {"opm": [], "sustained": {}}


def emit(row: dict) -> None:
    print(json.dumps(row), flush=True)


def relative_error(value, reference) -> float:
    return float((value.double() - reference).norm() / reference.norm())


autocast = lambda: torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False)  # noqa: E731
for tokens in (849, 1672, 2472):
    generator = torch.Generator(device=device).manual_seed(tokens)
    msa_rows = 2048
    mask = (torch.rand(1, msa_rows, tokens, generator=generator, device=device) > 0.1).float()
    a = (torch.randn(1, msa_rows, tokens, 32, generator=generator, device=device) * mask[..., None]).bfloat16()
    b = (torch.randn(1, msa_rows, tokens, 32, generator=generator, device=device) * mask[..., None]).bfloat16()
    weight = (torch.randn(128, 1024, generator=generator, device=device) / 32).bfloat16()
    bias = torch.randn(128, device=device, generator=generator).bfloat16()
    reference_rows = max(1, (256 << 20) // (tokens * 32 * 32 * 4))
    row = {"tokens": tokens, "msa_rows": msa_rows}
    with torch.no_grad(), autocast():
        row["reference_ms"] = round(cuda_median_ms(lambda: outer_product_mean_update(a, b, mask, weight, bias, reference_rows), 3, warmup=1), 2)
        for index, config in enumerate(CONFIGS):
            from foldmill.kernels import triton_outer_product_kernel as module

            def run(config=config):
                original = module.config_for
                module.config_for = lambda channels, _=None: original(channels, config)
                try:
                    return triton_outer_product.outer_product_mean_update(a, b, mask, weight, bias)
                finally:
                    module.config_for = original

            start = time.perf_counter()
            run()
            torch.cuda.synchronize()
            row[f"triton_{index}_first_s"] = round(time.perf_counter() - start, 2)
            row[f"triton_{index}_ms"] = round(cuda_median_ms(run, 3, warmup=1), 2)
            if tokens == 849:
                expected = torch.einsum("bsi,bsj->bij", mask.double(), mask.double()).clamp(min=1)
                expected = (torch.einsum("bsic,bsjd->bijcd", a.double(), b.double()).flatten(-2) / expected[..., None]) @ weight.double().T + bias.double()
                row[f"triton_{index}_error"] = round(relative_error(run(), expected), 5)
                if index == 0:
                    row["reference_error"] = round(relative_error(outer_product_mean_update(a, b, mask, weight, bias, reference_rows), expected), 5)
                del expected
    report["opm"].append(row)
    emit(row)
    del a, b, mask
    torch.cuda.empty_cache()

# (2) sustained load: one trunk pair block, call by call.
model = Boltz2(Boltz2Config())
randomize_weights(model, 0)
fast = FastBoltz2(model.eval(), device=device)
stack = fast.network.pairformer_module
stack = getattr(stack, "stack", stack)
layer = stack.layers[0]
tokens = 2472
z = torch.randn(1, tokens, tokens, 128, device=device)
pair_mask = torch.ones(1, tokens, tokens, device=device)
with kernels.kernel_policy(enabled=True), torch.no_grad(), autocast():
    layer.update_pair(z, pair_mask, 128, in_place=True)
    torch.cuda.synchronize()
    time.sleep(5)
    times = []
    wall = time.perf_counter()
    while time.perf_counter() - wall < 12:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        layer.update_pair(z, pair_mask, 128, in_place=True)
        end.record()
        end.synchronize()
        times.append(round(start.elapsed_time(end), 1))
        z.mul_(0.5)  # keeps values bounded over many in-place updates
report["sustained"] = {"tokens": tokens, "update_pair_ms": times, "time_s": [round(sum(times[: k + 1]) / 1000, 2) for k in range(len(times))]}
emit({"sustained_ms_first_10": times[:10], "last_10": times[-10:], "calls": len(times)})
(out_dir / "opm_and_clocks.json").write_text(json.dumps(report, indent=1))
