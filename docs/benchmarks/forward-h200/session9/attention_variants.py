"""Session 9 device micro-benchmark: launch variants of the flash triangle-attention kernel.

Inputs as the model hands them over (1 x N rows x 4 heads x 32, gated, bf16, the key-contiguous
bias; the last N/16 tokens padding: their rows fully masked, their keys masked in every row).
Per variant and size: median milliseconds of 5 calls after 2 warm-ups, the relative error against
an fp32 reference on 8 valid rows, and the maximum difference from the shipped kernel's output.
Variants (attention_kernel_variant.py): rows per program, the p clamp, tile shape, warps, stages,
maxnreg (registers per thread, hence programs per SM), mma.sync instead of wgmma.

Usage (device): python3 attention_variants.py OUT_DIR 1024,1700,2472
"""

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import attention_kernel_variant as variant  # noqa: E402

from foldmill.kernels.triton_triangle_attention_kernel import BlockConfig, flash_triangle_attention  # noqa: E402

HEADS, DIM = 4, 32
# Lease 1: name -> (block_m, block_n, warps, stages, two_rows, clamp, maxnreg, mmav2)
LEASE1 = {
    "control_64x64_w4_s3": (64, 64, 4, 3, True, True, None, False),
    "noclamp": (64, 64, 4, 3, True, False, None, False),
    "maxnreg168": (64, 64, 4, 3, True, True, 168, False),
    "maxnreg168_noclamp": (64, 64, 4, 3, True, False, 168, False),
    "one_row": (64, 64, 4, 3, False, True, None, False),
    "one_row_maxnreg128": (64, 64, 4, 3, False, True, 128, False),
    "one_row_noclamp": (64, 64, 4, 3, False, False, None, False),
    "bn32": (64, 32, 4, 3, True, True, None, False),
    "bn32_noclamp": (64, 32, 4, 3, True, False, None, False),
    "bn32_maxnreg128": (64, 32, 4, 3, True, True, 128, False),
    "bn32_maxnreg128_noclamp": (64, 32, 4, 3, True, False, 128, False),
    "bn32_s4": (64, 32, 4, 4, True, True, None, False),
    "bn32_one_row": (64, 32, 4, 3, False, True, None, False),
    "bm128_w8": (128, 64, 8, 3, True, True, None, False),
    "bm128_w8_one_row": (128, 64, 8, 3, False, True, None, False),
    "bm128_bn32_w8": (128, 32, 8, 3, True, True, None, False),
    "bm128_bn32_w8_maxnreg128": (128, 32, 8, 3, True, True, 128, False),
    "bm128_w8_one_row_maxnreg128": (128, 64, 8, 3, False, True, 128, False),
    "s2": (64, 64, 4, 2, True, True, None, False),
    "s4": (64, 64, 4, 4, True, True, None, False),
    "bn128": (64, 128, 4, 2, False, True, None, False),
    "mmav2": (64, 64, 4, 3, True, True, None, True),
    "mmav2_one_row": (64, 64, 4, 3, False, True, None, True),
    "mmav2_bm128_w8": (128, 64, 8, 3, True, True, None, True),
    "mmav2_bn32": (64, 32, 4, 3, True, True, None, True),
}
FIELDS = ("block_m", "block_n", "warps", "stages", "two_rows", "clamp", "maxnreg", "mmav2")
VARIANTS = {name: dict(zip(FIELDS, values, strict=True)) for name, values in LEASE1.items()}
# Lease 2: around lease 1's best (64 x 32 tiles, two rows, 128 registers, no p clamp); group = L2 group
# in queries, mask_logit = the key bias of masked keys (-1e9 as shipped).
BEST = VARIANTS["bn32_maxnreg128_noclamp"]
VARIANTS |= {
    "best_mask1e6": BEST | {"mask_logit": -1e6},
    "best_maxnreg112": BEST | {"maxnreg": 112},
    "best_maxnreg96": BEST | {"maxnreg": 96},
    "best_group512": BEST | {"group_queries": 512},
    "best_group2048": BEST | {"group_queries": 2048},
    "best_group4096": BEST | {"group_queries": 4096},
    "best_s2": BEST | {"stages": 2},
    "best_s4": BEST | {"stages": 4},
    "one_row_maxnreg128_noclamp": VARIANTS["one_row_maxnreg128"] | {"clamp": False},
    "one_row_maxnreg112_noclamp": VARIANTS["one_row_maxnreg128"] | {"clamp": False, "maxnreg": 112},
}


def inputs(tokens: int, device: str = "cuda"):
    generator = torch.Generator(device=device).manual_seed(tokens)
    projected = torch.randn(1, tokens, tokens, 4 * HEADS * DIM, generator=generator, device=device, dtype=torch.bfloat16)
    q, k, v, gate = projected.chunk(4, dim=-1)
    q, k, v = (t.view(1, tokens, tokens, HEADS, DIM).transpose(-2, -3) for t in (q, k, v))
    bias = (2 * torch.randn(1, tokens, tokens, HEADS, generator=generator, device=device)).to(torch.bfloat16)
    bias = bias.permute(0, 3, 1, 2).contiguous().unsqueeze(1)  # (1, 1, H, J, J), key-contiguous
    valid = torch.arange(tokens, device=device) < tokens - tokens // 16
    mask = (valid[:, None] & valid[None, :]).view(1, tokens, 1, 1, tokens)
    return projected, q, k, v, bias, mask, gate, valid


def reference_rows(q, k, v, bias, mask, gate, rows):
    """fp32 gated attention for a few rows: (len(rows), J, H*D)."""
    out = []
    for row in rows:
        logits = DIM**-0.5 * q[0, row].float() @ k[0, row].float().transpose(-1, -2) + bias[0, 0].float()
        logits = logits + torch.where(mask[0, row, 0, 0], 0.0, -1e9)[None, None, :]
        o = torch.softmax(logits, -1) @ v[0, row].float()  # (H, J, D)
        out.append(o.transpose(0, 1).reshape(o.shape[1], -1) * torch.sigmoid(gate[0, row].float()))
    return torch.stack(out)


def timed(fn, reps: int = 5) -> float:
    for _ in range(2):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def main(out_dir: Path, sizes: list[int], names: list[str]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for tokens in sizes:
        projected, q, k, v, bias, mask, gate, valid = inputs(tokens)
        scale = DIM**-0.5
        rows = [1, 2, tokens // 2, tokens // 2 + 1, int(valid.sum()) - 2, int(valid.sum()) - 1]
        expected = reference_rows(q, k, v, bias, mask, gate, rows)

        def shipped():
            return flash_triangle_attention(q, k, v, bias, mask, scale, torch.bfloat16, BlockConfig(64, 64, 4, 3), gate=gate)

        baseline = shipped()
        ms = timed(shipped)
        error = float((baseline[0, rows].float() - expected).norm() / expected.norm())
        row = {"tokens": tokens, "variant": "shipped", "ms": round(ms, 3), "error": round(error, 5)}
        print(json.dumps(row), flush=True)
        results.append(row)
        for name in names:
            settings = VARIANTS[name]

            def run():
                return variant.launch(q, k, v, bias, mask, scale, gate, **settings)

            try:
                started = time.perf_counter()
                out = run()
                torch.cuda.synchronize()
                first_s = time.perf_counter() - started
                ms = timed(run)
            except Exception as failure:  # a variant that does not compile or launch is reported, not fatal
                row = {"tokens": tokens, "variant": name, "failed": str(failure).splitlines()[0][:300]}
                print(json.dumps(row), flush=True)
                results.append(row)
                continue
            error = float((out[0, rows].float() - expected).norm() / expected.norm())
            valid_rows = out[0, valid]
            diff = float((valid_rows.float() - baseline[0, valid].float()).abs().max())
            row = {"tokens": tokens, "variant": name, "ms": round(ms, 3), "error": round(error, 5),
                   "max_diff_vs_shipped": round(diff, 4), "finite": bool(torch.isfinite(out).all()),
                   "first_call_s": round(first_s, 2)}  # fmt: skip
            print(json.dumps(row), flush=True)
            results.append(row)
            del out
        del projected, q, k, v, bias, mask, gate, baseline
        torch.cuda.empty_cache()
        (out_dir / "attention_variants.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), [int(n) for n in sys.argv[2].split(",")], sys.argv[3].split(",") if len(sys.argv) > 3 else list(VARIANTS))
