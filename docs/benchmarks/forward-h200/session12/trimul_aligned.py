"""Session 12 device micro-benchmark (issue 6): the triangle multiplication's kernels with the token count
restated as a multiple of 8 (ALIGN: 16-byte vector stores of a_t / b_t and loads of the product), against
session 11's kernels (bench-tmp/trimul_kernel_session11.py: `git show c4daee2:src/foldmill/kernels/
triton_triangle_multiplication_kernel.py`), in one process: each kernel alone and the whole update
(fused_update, with the residual add as the trunk runs it), both directions. 1 x N x N x 128 fp32 pair,
bf16, median ms of 7 after 2 warm-ups; the largest difference between the two updates.

Usage (device): python3 trimul_aligned.py OUT_DIR SESSION11_KERNEL.py 1704,2472
"""

import importlib.util
import json
import sys
from pathlib import Path

import torch

from foldmill.kernels import triton_triangle_multiplication_kernel as aligned
from foldmill.runtime.timing import cuda_median_ms


def load(path: str):
    spec = importlib.util.spec_from_file_location("trimul_kernel_session11", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def main(out_dir: Path, before_path: str, sizes: list[int]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda")
    modules = {"session11": load(before_path), "aligned": aligned}
    results = []
    for n in sizes:
        g = torch.Generator(device=device).manual_seed(n)
        x = torch.randn(1, n, n, 128, generator=g, device=device)
        valid = (torch.arange(n, device=device) < n - 5).float()
        mask = (valid[:, None] * valid[None, :])[None]
        s = 128**-0.5
        weights = [
            1 + 0.2 * torch.randn(128, generator=g, device=device), 0.2 * torch.randn(128, generator=g, device=device),
            torch.randn(256, 128, generator=g, device=device) * s, torch.randn(256, 128, generator=g, device=device) * s,
            1 + 0.2 * torch.randn(128, generator=g, device=device), 0.2 * torch.randn(128, generator=g, device=device),
            torch.randn(128, 128, generator=g, device=device) * s, torch.randn(128, 128, generator=g, device=device) * s,
        ]  # fmt: skip
        for direction in ("outgoing", "incoming"):
            outs = {}
            for name, module in modules.items():
                own = x.clone()

                def update(module=module, own=own, direction=direction):
                    with torch.no_grad():
                        return module.fused_update(own, direction, mask, weights, 1e-5, torch.bfloat16, residual_out=own)

                update()
                row = {"tokens": n, "direction": direction, "kernels": name}
                row["update_with_residual_ms"] = round(cuda_median_ms(update, repeats=7, warmup=2), 3)
                fresh = x.clone()
                with torch.no_grad():
                    module.fused_update(fresh, direction, mask, weights, 1e-5, torch.bfloat16, residual_out=fresh)
                outs[name] = fresh
                print(json.dumps(row), flush=True)
                results.append(row)
                del own
            diff = float((outs["session11"] - outs["aligned"]).abs().max())
            results.append({"tokens": n, "direction": direction, "max_diff": diff})
            print(json.dumps(results[-1]), flush=True)
            del outs
        # The kernels alone (outgoing), as session 11's trimul_configs.py times them.
        bf16 = torch.bfloat16
        p_in, g_in, p_out, g_out = (t.to(bf16).contiguous() for t in (weights[2], weights[3], weights[6], weights[7]))
        a_t = torch.empty((1, 128, n, n), device=device, dtype=bf16)
        b_t = torch.empty_like(a_t)
        product = torch.empty((128, n, n), device=device, dtype=bf16)
        own = x.clone()
        flags = {"DOT_PRECISION": "tf32", "EMULATE_BF16": False}
        for name, module in modules.items():
            programs = module.persistent_programs(device, 1, n)
            extra = {"ALIGN": 8 if n % 8 == 0 else 1} if name == "aligned" else {}
            edges_args = (x, mask, weights[0], weights[1], p_in, g_in, a_t, b_t, n, 1, *x.stride()[:3], *mask.stride(), 1e-5)
            output_args = (product, x, own, weights[0], weights[1], weights[4], weights[5], p_out, g_out, n, 1,
                           *x.stride()[:3], *own.stride()[:3], 1e-5)  # fmt: skip
            row = {"tokens": n, "kernels": name}
            row["edges_ms"] = round(cuda_median_ms(lambda: module._launch(
                module._gated_edges_kernel, programs, module.EDGES_CONFIG, *edges_args, C=128, **extra, **flags), 7, warmup=2), 3)  # fmt: skip
            row["output_ms"] = round(cuda_median_ms(lambda: module._launch(
                module._gated_output_kernel, programs, module.OUTPUT_CONFIG, *output_args, C=128, RESIDUAL=True, **extra,
                **flags), 7, warmup=2), 3)  # fmt: skip
            print(json.dumps(row), flush=True)
            results.append(row)
        del x, a_t, b_t, product, own
        torch.cuda.empty_cache()
    (out_dir / "trimul_aligned.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], [int(x) for x in sys.argv[3].split(",")])
