"""Session 8, device only: the pair-weighted-average op, reference vs the Triton backend (each block
config), alone and inside the MSA module's PairWeightedAveraging (by head, as the model runs it
above 384 tokens), at the throughput sample's sizes with 2,048 MSA rows; error against float64.

    python3 pwa_bench.py OUT_DIR
"""

import json
import sys
from pathlib import Path

import torch

from foldmill import kernels
from foldmill.kernels.triton_pair_average_kernel import CONFIGS, gated_pair_average as kernel
from foldmill.model.layers.pair_weighted_averaging import PairWeightedAveraging, gated_pair_average
from foldmill.runtime.timing import cuda_median_ms

out_dir = Path(sys.argv[1])
out_dir.mkdir(parents=True, exist_ok=True)
device = torch.device("cuda")
rows = []
autocast = lambda: torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False)  # noqa: E731
layer = PairWeightedAveraging(c_m=64, c_z=128, c_h=32, num_heads=8).to(device).eval()
for tokens in (849, 1672, 2472):
    generator = torch.Generator(device=device).manual_seed(tokens)
    msa_rows = 2048
    m = torch.randn(1, msa_rows, tokens, 64, device=device, generator=generator).bfloat16()
    z = torch.randn(1, tokens, tokens, 128, device=device, generator=generator)
    mask = torch.ones(1, tokens, tokens, device=device)
    mask[:, :, -3:] = 0
    row = {"tokens": tokens, "msa_rows": msa_rows}
    with torch.no_grad(), autocast():
        for backend in ("reference", "triton"):
            with kernels.kernel_policy(force={"pair_weighted_average": backend}):
                row[f"module_{backend}_ms"] = round(cuda_median_ms(lambda: layer(m, z, mask, True), 3, warmup=1), 2)
        # the op alone, one head (as the model calls it above 384 tokens)
        weights = torch.randn(1, 1, tokens, tokens, device=device, generator=generator).softmax(-1)
        values, gate = torch.randn(1, msa_rows, tokens, 64, device=device, generator=generator).bfloat16().chunk(2, -1)
        row["op_reference_ms"] = round(cuda_median_ms(lambda: gated_pair_average(weights, values, gate), 3, warmup=1), 2)
        for index, config in enumerate(CONFIGS):
            run = lambda config=config: kernel(weights, values, gate, torch.bfloat16, config)  # noqa: E731
            row[f"op_triton_{index}_ms"] = round(cuda_median_ms(run, 3, warmup=1), 2)
            if tokens == 849:
                expected = torch.einsum("bhij,bsjd->bsid", weights.double(), values.double()) * torch.sigmoid(gate.double())
                row[f"op_triton_{index}_error"] = float((run().double() - expected).norm() / expected.norm())
                if index == 0:
                    reference = gated_pair_average(weights, values, gate)
                    row["op_reference_error"] = float((reference.double() - expected).norm() / expected.norm())
    rows.append(row)
    print(json.dumps(row), flush=True)
    del m, z, mask, weights, values, gate
    torch.cuda.empty_cache()
(out_dir / "pwa_bench.json").write_text(json.dumps(rows, indent=1))
