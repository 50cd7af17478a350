"""Session 8, device only: the pair track's z += transition(z) at 1,672 and 2,472 tokens (fp32 z, bf16
autocast), session 7's way (the Triton transition by blocks of rows, then an fp32 add per block) against
an in-place variant of the kernel (a RESIDUAL flag: the epilogue adds into x) at each block config.
The variant lost (see NOTES.md) and is not in the repository: `Transition.add_to` and
`RESIDUAL_CONFIG` below belonged to it, so this script no longer runs as is.

    python3 residual_transition_bench.py OUT_DIR
"""

import json
import sys
from pathlib import Path

import torch

from foldmill import kernels
from foldmill.kernels import triton_transition_kernel
from foldmill.model.layers.pairformer import pair_transition_rows
from foldmill.model.layers.transition import Transition
from foldmill.runtime.timing import cuda_median_ms

device = torch.device("cuda")
module = Transition(128, 512).to(device).eval()
for linear in (module.fc1, module.fc2, module.fc3):
    linear.to(torch.bfloat16)
report = {}
for tokens in (1672, 2472):
    z = torch.randn(1, tokens, tokens, 128, device=device, generator=torch.Generator(device=device).manual_seed(0))
    rows = pair_transition_rows(tokens, 128)

    def by_blocks() -> None:
        for start in range(0, tokens, rows):
            z[:, start : start + rows] += module(z[:, start : start + rows])

    row = {"tokens": tokens, "block_rows": rows}
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
        row["session7_ms"] = round(cuda_median_ms(by_blocks, 5, warmup=2), 2)
        for index, config in enumerate(triton_transition_kernel.NARROW_CONFIGS):
            triton_transition_kernel.RESIDUAL_CONFIG = config
            row[f"in_place_{index}_ms"] = round(cuda_median_ms(lambda: module.add_to(z), 5, warmup=2), 2)
        # the same values: one block step each way from one start
        start_z = z.clone()
        by_blocks()
        blocks = z.clone()
        z.copy_(start_z)
        triton_transition_kernel.RESIDUAL_CONFIG = triton_transition_kernel.NARROW_CONFIGS[0]
        module.add_to(z)
        row["max_abs_difference"] = float((z - blocks).abs().max())
        row["max_abs_update"] = float((blocks - start_z).abs().max())
    row["kernel_calls"] = kernels.chosen_counts()
    report[tokens] = row
    print(json.dumps(row), flush=True)
    del z, start_z, blocks
    torch.cuda.empty_cache()
Path(sys.argv[1]).mkdir(parents=True, exist_ok=True)
(Path(sys.argv[1]) / "residual_transition.json").write_text(json.dumps(report, indent=1))
