"""Session 10 device micro-benchmark: the flash triangle-attention kernel with its folded bias padded
(no masked bias loads in the key loop) against session 9's kernel, in one process on one GPU.

Inputs as session 9's `attention_variants.py` makes them (1 x N rows x 4 heads x 32, gated, bf16, the
last N/16 tokens padding), with the token mask and with random per-row masks. Per kernel and size:
median ms of 5 calls after 2 warm-ups, the error against fp32 math on ~21 rows, and the largest
difference between the two kernels' outputs.

Usage (device): python3 attention_padded_bias.py OUT_DIR SESSION9_KERNEL.py 1024,1700,2472
"""

import importlib.util
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "session9"))
from attention_variants import inputs, random_row_mask, reference_rows  # noqa: E402

from foldmill.kernels import triton_triangle_attention_kernel as shipped  # noqa: E402
from foldmill.runtime.timing import cuda_median_ms  # noqa: E402


def load(path: str):
    spec = importlib.util.spec_from_file_location("attention_kernel_session9", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def main(out_dir: Path, before_path: str, sizes: list[int]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    kernels = {"session9": load(before_path), "padded_bias": shipped}
    rows_out = []
    for tokens in sizes:
        _, q, k, v, bias, mask, gate, valid = inputs(tokens)
        scale = 32**-0.5
        nvalid = int(valid.sum())
        rows = sorted({*range(0, nvalid, max(1, nvalid // 20)), nvalid - 1})
        expected = reference_rows(q, k, v, bias, mask, gate, rows)
        for mask_kind, used in (("token_mask", mask), ("random_mask", random_row_mask(tokens))):
            outs = {}
            for name, module in kernels.items():
                config = module.NARROW_CONFIGS[0]

                def call(module=module, config=config):
                    return module.flash_triangle_attention(
                        q, k, v, bias, used, scale, torch.bfloat16, config, gate=gate
                    )

                out = call()
                ms = round(cuda_median_ms(call, repeats=5, warmup=2), 3)
                row = {"tokens": tokens, "mask": mask_kind, "kernel": name, "ms": ms}
                row["finite"] = bool(torch.isfinite(out).all())
                if mask_kind == "token_mask":
                    row["error"] = round(float((out[0, rows].float() - expected).norm() / expected.norm()), 5)
                outs[name] = out
                print(json.dumps(row), flush=True)
                rows_out.append(row)
            diff = float((outs["session9"].float() - outs["padded_bias"].float()).abs().max())
            rows_out.append({"tokens": tokens, "mask": mask_kind, "max_diff": diff})
            print(json.dumps(rows_out[-1]), flush=True)
            del outs
    (out_dir / "attention_padded_bias.json").write_text(json.dumps(rows_out, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], [int(x) for x in sys.argv[3].split(",")])
