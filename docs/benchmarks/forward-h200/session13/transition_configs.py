"""Session 13 device micro-benchmark (issue 6): the fused transition's candidates, register-capped ones
included, as the trunk runs it: the pair by blocks of token rows (pair_transition_rows) plus the separate
residual add, and the whole MSA track (1 x 2,048 x N x 64); then the autotuned launch and the config it
kept. fp32 streams, bf16 weights, median ms of 7 after 2 warm-ups.

Usage (device): python3 transition_configs.py OUT_DIR 1704,2472
"""

import json
import sys
from pathlib import Path

import torch

from foldmill.kernels.triton_transition_kernel import NARROW_CONFIGS, _autotuned_kernel, fused_transition
from foldmill.model.layers.pairformer import pair_transition_rows
from foldmill.runtime.timing import cuda_median_ms


def weights(dim: int, device: torch.device, g: torch.Generator) -> list[torch.Tensor]:
    return [
        1 + 0.2 * torch.randn(dim, generator=g, device=device), 0.2 * torch.randn(dim, generator=g, device=device),
        (torch.randn(4 * dim, dim, generator=g, device=device) * dim**-0.5).bfloat16(),
        (torch.randn(4 * dim, dim, generator=g, device=device) * dim**-0.5).bfloat16(),
        (torch.randn(dim, 4 * dim, generator=g, device=device) * (4 * dim) ** -0.5).bfloat16(),
    ]  # fmt: skip


def name(config) -> str:
    return "autotuned" if config is None else f"{config.block_m}x{config.block_h}x{config.num_warps}/{config.max_registers}"


def main(out_dir: Path, sizes: list[int]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda")
    results = []
    for n in sizes:
        g = torch.Generator(device=device).manual_seed(n)
        for track, shape in (("pair", (1, n, n, 128)), ("msa", (1, 2048, n, 64))):
            w = weights(shape[-1], device, g)
            x = torch.randn(*shape, generator=g, device=device)
            rows = (pair_transition_rows(n, 128) or n) if track == "pair" else shape[1]
            first_rows = x[:, :rows].clone()  # the same input for every config's check (the timed steps add into x)
            expected = fused_transition(first_rows, *w, 1e-5, torch.bfloat16, NARROW_CONFIGS[1])
            row = {"tokens": n, "track": track, "rows_per_call": rows}
            for config in (*NARROW_CONFIGS, None):

                def step(config=config):
                    for start in range(0, shape[1], rows):
                        x[:, start : start + rows] += fused_transition(x[:, start : start + rows], *w, 1e-5, torch.bfloat16, config)

                with torch.no_grad():
                    check = fused_transition(first_rows, *w, 1e-5, torch.bfloat16, config)
                    row[f"{name(config)}_max_diff"] = float((check.float() - expected.float()).abs().max())
                    row[f"{name(config)}_ms"] = round(cuda_median_ms(step, repeats=7, warmup=2), 3)
            best = _autotuned_kernel.best_config
            row["autotuner_kept"] = [best.kwargs["BLOCK_M"], best.kwargs["BLOCK_H"], best.num_warps, best.maxnreg]
            print(json.dumps(row), flush=True)
            results.append(row)
            del x, first_rows, expected, check
            torch.cuda.empty_cache()
    (out_dir / "transition_configs.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), [int(x) for x in sys.argv[2].split(",")])
