"""Session 12 device micro-benchmark (issue 6).

1. The flash triangle-attention kernel with bounded softmax (the folded path runs against Cauchy-Schwarz
   bounds of each row's logits: no running max, no rescaling) against session 11's kernel, in one process:
   median ms of 5 calls after 2 warm-ups, the error against fp32 math on ~21 rows, the largest difference
   between the two kernels, and how far the bounds sit above the rows' largest logits (log2 units; the
   kernel reruns a row pair with running maxima beyond 96).
2. The attention output projection and residual add: F.linear then z += (today), against one cuBLAS
   call with an fp32 output accumulating into z (addmm / baddbmm with out_dtype), for both nodes.

Inputs as session 9's `attention_variants.py` (1 x N rows x 4 heads x 32, gated, bf16, the last N/16
tokens padding).

Usage (device): python3 attention_bounded.py OUT_DIR SESSION11_KERNEL.py 1024,1700,2472
"""

import importlib.util
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parents[1] / "session9"))
from attention_variants import DIM, inputs, random_row_mask, reference_rows  # noqa: E402

from foldmill.kernels import triton_triangle_attention_kernel as shipped  # noqa: E402
from foldmill.runtime.timing import cuda_median_ms  # noqa: E402


def load(path: str):
    spec = importlib.util.spec_from_file_location("attention_kernel_session11", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def bound_gaps(q, k, bias, mask, rows) -> list[float]:
    """Quantiles over (row, head, query) of bound - largest logit, log2 units, as the kernel bounds them."""
    scale = DIM**-0.5
    shared = mask[0, :, 0, 0].any(0)
    folded = bias[0, 0].float() + torch.where(shared, 0.0, -1e9)[None, None, :]
    gaps = []
    for row in rows:
        qs = (q[0, row].float() * scale).to(torch.bfloat16).float()  # (H, J, D), rounded as the kernel does
        kr = k[0, row].float()
        logits = qs @ kr.transpose(-1, -2) + folded
        bound = folded.amax(-1) + qs.norm(dim=-1) * kr.norm(dim=-1).amax(-1)[:, None]
        gaps.append(((bound - logits.amax(-1)) * 1.4426950408889634).flatten())
    gaps = torch.cat(gaps)
    return [round(float(x), 2) for x in torch.quantile(gaps, torch.tensor([0.0, 0.5, 0.99, 1.0], device=gaps.device))]


def attention(out_dir: Path, before_path: str, sizes: list[int]) -> list[dict]:
    kernels = {"session11": load(before_path), "bounded": shipped}
    results = []
    for tokens in sizes:
        _, q, k, v, bias, mask, gate, valid = inputs(tokens)
        scale = DIM**-0.5
        nvalid = int(valid.sum())
        rows = sorted({*range(0, nvalid, max(1, nvalid // 20)), nvalid - 1})
        expected = reference_rows(q, k, v, bias, mask, gate, rows)
        results.append({"tokens": tokens, "bound_gap_log2_min_median_p99_max": bound_gaps(q, k, bias, mask, rows)})
        print(json.dumps(results[-1]), flush=True)
        for mask_kind, used in (("token_mask", mask), ("random_mask", random_row_mask(tokens))):
            outs = {}
            for name, module in kernels.items():
                config = module.NARROW_CONFIGS[0]

                def call(module=module, config=config):
                    return module.flash_triangle_attention(q, k, v, bias, used, scale, torch.bfloat16, config, gate=gate)

                out = call()
                row = {"tokens": tokens, "mask": mask_kind, "kernel": name}
                row["ms"] = round(cuda_median_ms(call, repeats=5, warmup=2), 3)
                row["finite"] = bool(torch.isfinite(out).all())
                if mask_kind == "token_mask":
                    row["error"] = round(float((out[0, rows].float() - expected).norm() / expected.norm()), 5)
                outs[name] = out
                print(json.dumps(row), flush=True)
                results.append(row)
            diff = float((outs["session11"].float() - outs["bounded"].float()).abs().max())
            results.append({"tokens": tokens, "mask": mask_kind, "max_diff": diff})
            print(json.dumps(results[-1]), flush=True)
            del outs
    return results


def output_projection(sizes: list[int]) -> list[dict]:
    results = []
    for tokens in sizes:
        generator = torch.Generator(device="cuda").manual_seed(tokens)
        z = torch.randn(1, tokens, tokens, 128, generator=generator, device="cuda")
        gated = torch.randn(1, tokens, tokens, 128, generator=generator, device="cuda").to(torch.bfloat16)
        weight = (torch.randn(128, 128, generator=generator, device="cuda") / 128**0.5).to(torch.bfloat16)
        for node in ("starting", "ending"):
            def today(z=z, node=node):
                out = F.linear(gated, weight)
                z.add_(out if node == "starting" else out.transpose(-2, -3))

            def fused(z=z, node=node):
                if node == "starting":
                    flat = z.view(-1, 128)
                    torch.addmm(flat, gated.view(-1, 128), weight.t(), out_dtype=torch.float32, out=flat)
                else:  # z[0, j] (N x 128) += gated[0, :, j] (row stride N * 128) @ W^T, batched over j
                    torch.baddbmm(z[0], gated[0].transpose(0, 1), weight.t().expand(tokens, 128, 128),
                                  out_dtype=torch.float32, out=z[0])  # fmt: skip

            row = {"tokens": tokens, "node": node}
            try:
                base = z.clone()
                today(base)
                check = z.clone()
                fused(check)
                row["max_diff_vs_today"] = float((check - base).abs().max())
                row["same_storage"] = True
                del base, check
                row["today_ms"] = round(cuda_median_ms(today, repeats=5, warmup=2), 3)
                row["fused_ms"] = round(cuda_median_ms(fused, repeats=5, warmup=2), 3)
            except Exception as error:  # noqa: BLE001 - report what the call refuses
                row["error"] = f"{type(error).__name__}: {error}"[:300]
            print(json.dumps(row), flush=True)
            results.append(row)
        del z, gated
    return results


def main(out_dir: Path, before_path: str, sizes: list[int]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    results = {"attention": attention(out_dir, before_path, sizes), "output_projection": output_projection(sizes)}
    (out_dir / "attention_bounded.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], [int(x) for x in sys.argv[3].split(",")])
