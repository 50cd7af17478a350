"""Session 8, device only: PairWeightedAveraging by head as the fast path holds it (bf16 weights),
the session-7 module (separate value and gate products) against this session's (one product, then
the reference or the Triton average), at the throughput sample's sizes with 2,048 MSA rows.

    python3 pwa_module_check.py OUT_DIR
"""

import json
import sys
from pathlib import Path

import torch
from torch import Tensor

from foldmill import kernels
from foldmill.model.layers.pair_weighted_averaging import PairWeightedAveraging
from foldmill.runtime.timing import cuda_median_ms


class Session7PairWeightedAveraging(PairWeightedAveraging):
    """Session 7's head update: the values and the gate from two products."""

    def _head_update(self, m: Tensor, z: Tensor, mask: Tensor, heads: slice) -> Tensor:
        channels = slice(heads.start * self.c_h, heads.stop * self.c_h)
        n_heads = heads.stop - heads.start
        values = m @ self.proj_m.weight[channels].T
        values = values.reshape(*values.shape[:3], n_heads, self.c_h).permute(0, 3, 1, 2, 4)
        logits = (z @ self.proj_z.weight[heads].T).permute(0, 3, 1, 2)
        logits = logits + (1 - mask[:, None]) * -self.inf
        weights = torch.softmax(logits, dim=-1)
        gate = (m @ self.proj_g.weight[channels].T).sigmoid()
        out = torch.einsum("bhij,bhsjd->bhsid", weights, values).permute(0, 2, 3, 1, 4)
        return gate * out.reshape(*out.shape[:3], n_heads * self.c_h)


device = torch.device("cuda")
new = PairWeightedAveraging(64, 128, 32, 8).to(device).eval()
old = Session7PairWeightedAveraging(64, 128, 32, 8).to(device).eval()
old.load_state_dict(new.state_dict())
for module in (new, old):
    for linear in (module.proj_m, module.proj_g, module.proj_z, module.proj_o):
        linear.to(torch.bfloat16)
rows = []
for tokens in (849, 1672, 2472):
    generator = torch.Generator(device=device).manual_seed(tokens)
    m = torch.randn(1, 2048, tokens, 64, device=device, generator=generator).bfloat16()
    z = torch.randn(1, tokens, tokens, 128, device=device, generator=generator)
    mask = torch.ones(1, tokens, tokens, device=device)
    row = {"tokens": tokens}
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
        row["session7_ms"] = round(cuda_median_ms(lambda: old(m, z, mask, True), 5, warmup=2), 2)
        for backend in ("reference", "triton"):
            with kernels.kernel_policy(force={"pair_weighted_average": backend}):
                row[f"session8_{backend}_ms"] = round(cuda_median_ms(lambda: new(m, z, mask, True), 5, warmup=2), 2)
        with kernels.kernel_policy(force={"pair_weighted_average": "reference"}):
            row["max_abs_difference"] = float((old(m, z, mask, True).float() - new(m, z, mask, True).float()).abs().max())
    rows.append(row)
    print(json.dumps(row), flush=True)
    del m, z, mask
    torch.cuda.empty_cache()
Path(sys.argv[1]).mkdir(parents=True, exist_ok=True)
(Path(sys.argv[1]) / "pwa_module_check.json").write_text(json.dumps(rows, indent=1))
