"""One pair block's parts at one size, timed alone (CUDA events, median of 3 after a warm-up), and a
kernel table of one whole block; the MSA module's outer product mean and pair-weighted averaging
likewise. Device only (session 8).

    python3 pair_block_parts.py OUT_DIR TOKENS MSA_ROWS
"""

import json
import math
import sys
from pathlib import Path

import torch
from torch.nn import functional as F
from torch.profiler import ProfilerActivity, profile

from foldmill import kernels
from foldmill.model.boltz2 import Boltz2
from foldmill.model.config import Boltz2Config
from foldmill.model.demo import randomize_weights
from foldmill.model.fastpath import FastBoltz2
from foldmill.model.layers.triangle_attention import projection_block_rows
from foldmill.runtime.timing import cuda_median_ms

out_dir = Path(sys.argv[1])
out_dir.mkdir(parents=True, exist_ok=True)
tokens, msa_rows = int(sys.argv[2]), int(sys.argv[3])
device = torch.device("cuda")
model = Boltz2(Boltz2Config())
randomize_weights(model, 0)
fast = FastBoltz2(model.eval(), device=device)
network = fast.network
stack = network.pairformer_module.stack if hasattr(network.pairformer_module, "stack") else network.pairformer_module
layer = stack.layers[0]
msa_layer = network.msa_module.layers[0]
generator = torch.Generator(device=device).manual_seed(0)
z = torch.randn(1, tokens, tokens, 128, device=device, generator=generator)
pair_mask = torch.ones(1, tokens, tokens, device=device)
m = torch.randn(1, msa_rows, tokens, 64, device=device, generator=generator).bfloat16()
msa_mask = torch.ones(1, msa_rows, tokens, device=device)
report: dict = {"tokens": tokens, "msa_rows": msa_rows}


def timed(name: str, fn, repeats: int = 3) -> None:
    with kernels.kernel_policy(enabled=True), torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
        report[name] = round(cuda_median_ms(fn, repeats, warmup=1), 2)
    print(name, report[name], flush=True)


chunk = 128
for attention_name in ("tri_att_start", "tri_att_end"):
    attention = getattr(layer, attention_name)
    x = z if attention.starting else z.transpose(-2, -3)
    mask = pair_mask if attention.starting else pair_mask.transpose(-1, -2)
    timed(f"{attention_name}.whole", lambda: attention(z, pair_mask, chunk))
    timed(f"{attention_name}.layer_norm", lambda: attention.layer_norm(x))
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
        normed = attention.layer_norm(x)
    timed(f"{attention_name}.bias", lambda: attention.linear(normed).permute(0, 3, 1, 2).unsqueeze(1).contiguous())
    weight = torch.cat(attention.mha.projection_weights())
    rows = projection_block_rows(1, tokens, weight.shape[0], 2)
    timed(f"{attention_name}.projection_block", lambda: F.linear(normed[:, :rows], weight))
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
        bias = attention.linear(normed).permute(0, 3, 1, 2).unsqueeze(1).contiguous()
        projected = F.linear(normed[:, :rows], weight)
        key_mask = mask[:, :, None, None, :].bool()
    timed(f"{attention_name}.mha_block", lambda: attention.mha(projected, bias, key_mask[:, :rows], chunk))
    q, k, v, gate = projected.chunk(4, dim=-1)
    heads = lambda t: t.view(*t.shape[:-1], 4, 32).transpose(-2, -3)  # noqa: E731
    from foldmill.model.layers.triangle_attention import gated_triangle_attention

    timed(
        f"{attention_name}.flash_block",
        lambda: kernels.dispatch(
            "gated_triangle_attention", gated_triangle_attention, heads(q), heads(k), heads(v), bias,
            key_mask[:, :rows], 1 / math.sqrt(32), gate, chunk,
        ),
    )  # fmt: skip
    report[f"{attention_name}.blocks"] = math.ceil(tokens / rows)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
        update = attention(z, pair_mask, chunk)
    timed(f"{attention_name}.residual_add", lambda: z.add_(update))
    del update, projected, normed, bias

timed("transition_z.whole", lambda: layer.transition_z(z[:, : tokens // 8]))
timed("tri_mul_out.whole", lambda: layer.tri_mul_out(z, pair_mask))
timed("tri_mul_in.whole", lambda: layer.tri_mul_in(z, pair_mask))
timed("update_pair", lambda: layer.update_pair(z, pair_mask, chunk, in_place=True), repeats=2)

opm = msa_layer.outer_product_mean
opm_rows = max(1, (256 << 20) // (tokens * 32 * 32 * 4))
timed("outer_product_mean.whole", lambda: opm(m, msa_mask, opm_rows))
timed("pair_weighted_averaging.whole", lambda: msa_layer.pair_weighted_averaging(m, z, pair_mask, True))

with profile(activities=[ProfilerActivity.CUDA]) as prof:
    with kernels.kernel_policy(enabled=True), torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
        layer.update_pair(z, pair_mask, chunk, in_place=True)
        opm(m, msa_mask, opm_rows)
        msa_layer.pair_weighted_averaging(m, z, pair_mask, True)
    torch.cuda.synchronize()
(out_dir / f"kernels_pair_block_{tokens}.txt").write_text(
    prof.key_averages().table(sort_by="cuda_time_total", row_limit=50, max_name_column_width=120)
)
(out_dir / f"pair_block_parts_{tokens}.json").write_text(json.dumps(report, indent=1))
