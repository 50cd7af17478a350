"""Session 12 device micro-benchmark (issue 6): the flash triangle-attention kernel's tiles.

The shipped 64 x 32 tiles at 4 warps (capped at 128 registers: four programs per SM) against 128-query
tiles at 8 warps (each warpgroup still takes 64 queries, so the same registers per thread, but every
key/value tile loaded serves twice the queries), for the shipped kernel and the bounded-softmax variant
(bench-tmp/attention_kernel_bounded.py: lease 1's kernel). Median ms of 5 calls after 2 warm-ups, error
against fp32 math on ~21 rows. Inputs as session 9's `attention_variants.py`.

Usage (device): python3 attention_tiles.py OUT_DIR BOUNDED_KERNEL.py 1700,2472
"""

import importlib.util
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "session9"))
from attention_variants import DIM, inputs, random_row_mask, reference_rows  # noqa: E402

from foldmill.kernels import triton_triangle_attention_kernel as shipped  # noqa: E402
from foldmill.runtime.timing import cuda_median_ms  # noqa: E402

CONFIGS = {
    "64x32_w4_s3_r128": (64, 32, 4, 3, 128),
    "128x32_w8_s3_r128": (128, 32, 8, 3, 128),
    "128x32_w8_s2_r128": (128, 32, 8, 2, 128),
    "128x32_w8_s4_r128": (128, 32, 8, 4, 128),
    "128x32_w8_s3": (128, 32, 8, 3, None),
}


def load(path: str):
    spec = importlib.util.spec_from_file_location("attention_kernel_bounded", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def main(out_dir: Path, bounded_path: str, sizes: list[int]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    kernels = {"shipped": shipped, "bounded": load(bounded_path)}
    results = []
    for tokens in sizes:
        _, q, k, v, bias, mask, gate, valid = inputs(tokens)
        nvalid = int(valid.sum())
        rows = sorted({*range(0, nvalid, max(1, nvalid // 20)), nvalid - 1})
        expected = reference_rows(q, k, v, bias, mask, gate, rows)
        masks = {"token_mask": mask, "random_mask": random_row_mask(tokens)}
        for kernel_name, module in kernels.items():
            for config_name, values in CONFIGS.items():
                config = module.BlockConfig(*values)
                for mask_kind, used in masks.items():
                    if mask_kind == "random_mask" and config_name not in ("64x32_w4_s3_r128", "128x32_w8_s3_r128"):
                        continue
                    row = {"tokens": tokens, "kernel": kernel_name, "config": config_name, "mask": mask_kind}

                    def call(module=module, config=config, used=used):
                        return module.flash_triangle_attention(
                            q, k, v, bias, used, DIM**-0.5, torch.bfloat16, config, gate=gate
                        )

                    try:
                        out = call()
                        row["ms"] = round(cuda_median_ms(call, repeats=5, warmup=2), 3)
                        if mask_kind == "token_mask":
                            row["error"] = round(float((out[0, rows].float() - expected).norm() / expected.norm()), 5)
                        row["finite"] = bool(torch.isfinite(out).all())
                        del out
                    except Exception as error:  # noqa: BLE001 - report what does not compile or launch
                        row["error"] = f"{type(error).__name__}: {error}"[:200]
                    print(json.dumps(row), flush=True)
                    results.append(row)
        del q, k, v, bias, mask, gate, masks
    (out_dir / "attention_tiles.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], [int(x) for x in sys.argv[3].split(",")])
