"""Session 9 device micro-benchmark: launch variants of the flash triangle-attention kernel.

Inputs as the model hands them over (1 x N rows x 4 heads x 32, gated, bf16, the key-contiguous
bias; the last N/16 tokens padding: their rows fully masked, their keys masked in every row).
Per variant and size: median milliseconds of 5 calls after 2 warm-ups, the relative error against
an fp32 reference on 8 valid rows, and the maximum difference from the shipped kernel's output.
Variants (attention_kernel_variant.py): rows per program, the p clamp, tile shape, warps, stages,
maxnreg (registers per thread, hence programs per SM), mma.sync instead of wgmma.

Usage (device): python3 attention_variants.py OUT_DIR 1024,1700,2472 [VARIANT,...] [SHIPPED_CONFIG,...]
(lease 4 on: the shipped launcher with each pinned configuration first, then the variants)
"""

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import attention_kernel_variant as variant  # noqa: E402

from foldmill.kernels.triton_triangle_attention_kernel import BlockConfig, flash_triangle_attention  # noqa: E402
from foldmill.runtime.timing import cuda_median_ms  # noqa: E402

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
# Lease 3, around the shipped kernel (lease 2's best): the key bias folded into the bias tile by the
# launcher (rows sharing one key mask), the bias read in fp32 (no conversions in the loop).
SHIPPED = BEST
VARIANTS |= {
    "shipped_fold": SHIPPED | {"fold_key_bias": True},
    "shipped_bias_fp32": SHIPPED | {"bias_fp32": True},
    "shipped_fold_bias_fp32": SHIPPED | {"fold_key_bias": True, "bias_fp32": True},
    "one_row_fold": VARIANTS["one_row_maxnreg128_noclamp"] | {"fold_key_bias": True},
    "one_row_fold_bias_fp32": VARIANTS["one_row_maxnreg128_noclamp"] | {"fold_key_bias": True, "bias_fp32": True},
    "bn64_fold_maxnreg168": VARIANTS["maxnreg168_noclamp"] | {"fold_key_bias": True},
    "bn64_fold": VARIANTS["noclamp"] | {"fold_key_bias": True},
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


def timed(fn) -> float:
    """Median milliseconds of 5 calls after 2 warm-ups."""
    return cuda_median_ms(fn, repeats=5, warmup=2)


# Lease 4: the shipped launcher (folded key mask, two loops) with pinned block configurations.
SHIPPED_CONFIGS = {
    "64x32_w4_s3_r128": BlockConfig(64, 32, 4, 3, 128),
    "64x64_w4_s3_r168": BlockConfig(64, 64, 4, 3, 168),
    "64x64_w4_s3_r128": BlockConfig(64, 64, 4, 3, 128),
    "64x64_w4_s3": BlockConfig(64, 64, 4, 3),
}


def torch_bf16_rows(q, k, v, bias, mask, gate, rows):
    """PyTorch's own bf16 computation of the same rows (the tests' yardstick for the kernel's error)."""
    out = []
    for row in rows:
        logits = (DIM**-0.5 * q[0, row]) @ k[0, row].transpose(-1, -2) + bias[0, 0]
        logits = logits.float() + torch.where(mask[0, row, 0, 0], 0.0, -1e9)[None, None, :]
        o = (torch.softmax(logits, -1).to(torch.bfloat16) @ v[0, row]).float()
        out.append(o.transpose(0, 1).reshape(o.shape[1], -1) * torch.sigmoid(gate[0, row].float()))
    return torch.stack(out)


def random_row_mask(tokens: int, device: str = "cuda"):
    """Keys ~10% masked independently per row: no row conforms (the per-row key-bias loop)."""
    generator = torch.Generator(device=device).manual_seed(1)
    return torch.rand(1, tokens, 1, 1, tokens, generator=generator, device=device) > 0.1


def main(out_dir: Path, sizes: list[int], names: list[str], configs: list[str]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []

    def report(row: dict) -> None:
        print(json.dumps(row), flush=True)
        results.append(row)

    for tokens in sizes:
        projected, q, k, v, bias, mask, gate, valid = inputs(tokens)
        scale = DIM**-0.5
        nvalid = int(valid.sum())
        rows = sorted({*range(0, nvalid, max(1, nvalid // 20)), nvalid - 1})
        expected = reference_rows(q, k, v, bias, mask, gate, rows)
        torch_error = float((torch_bf16_rows(q, k, v, bias, mask, gate, rows) - expected).norm() / expected.norm())
        report({"tokens": tokens, "variant": "torch_bf16", "error": round(torch_error, 5), "rows": len(rows)})
        outputs = {}
        for config_name in configs:
            config = SHIPPED_CONFIGS[config_name]
            for mask_kind, used_mask in (("token_mask", mask), ("random_mask", random_row_mask(tokens))):
                if mask_kind == "random_mask" and config_name != configs[0]:
                    continue

                def shipped():
                    return flash_triangle_attention(q, k, v, bias, used_mask, scale, torch.bfloat16, config, gate=gate)

                started = time.perf_counter()
                out = shipped()
                torch.cuda.synchronize()
                first_s = time.perf_counter() - started
                row = {"tokens": tokens, "variant": f"shipped_{config_name}_{mask_kind}", "ms": round(timed(shipped), 3),
                       "first_call_s": round(first_s, 2), "finite": bool(torch.isfinite(out).all())}  # fmt: skip
                if mask_kind == "token_mask":
                    row["error"] = round(float((out[0, rows].float() - expected).norm() / expected.norm()), 5)
                    outputs[config_name] = out
                report(row)
                del out
        first = outputs[configs[0]] if configs else None
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
                report({"tokens": tokens, "variant": name, "failed": str(failure).splitlines()[0][:300]})
                continue
            error = float((out[0, rows].float() - expected).norm() / expected.norm())
            row = {"tokens": tokens, "variant": name, "ms": round(ms, 3), "error": round(error, 5),
                   "finite": bool(torch.isfinite(out).all()), "first_call_s": round(first_s, 2)}  # fmt: skip
            if first is not None:  # the same math on valid rows: differences are rounding only
                row["max_diff_vs_shipped"] = round(float((out[0, valid].float() - first[0, valid].float()).abs().max()), 4)
            report(row)
            del out
        del projected, q, k, v, bias, mask, gate, outputs, first
        torch.cuda.empty_cache()
        (out_dir / "attention_variants.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    variants = sys.argv[3].split(",") if len(sys.argv) > 3 and sys.argv[3] else []
    shipped_configs = sys.argv[4].split(",") if len(sys.argv) > 4 else list(SHIPPED_CONFIGS)
    main(Path(sys.argv[1]), [int(n) for n in sys.argv[2].split(",")], variants, shipped_configs)
