"""The index of the routed ops: each has a folder here (its registration, default order, backends and
Triton kernels) and a plain PyTorch reference that the model registers (foldmill.kernels.registry), in
foldmill/model/layers/ or, for token_mean, foldmill/fastpath/.

| op                           | folder (foldmill/kernels/)    | reference                              | backends           |
|------------------------------|-------------------------------|----------------------------------------|--------------------|
| triangle_multiplication      | triangle_multiplication/      | layers/triangle_multiplication.py      | cueq, triton       |
| triangle_attention           | triangle_attention/           | layers/triangle_attention.py           | cueq, sdpa, triton |
| gated_triangle_attention     | gated_triangle_attention/     | layers/triangle_attention.py           | triton             |
| attention_pair_bias          | attention_pair_bias/          | layers/attention_pair_bias.py          | sdpa, triton       |
| transition                   | transition/                   | layers/transition.py                   | triton             |
| layer_norm                   | layer_norm/                   | layers/layer_norm.py                   | triton             |
| layer_norm_heads             | layer_norm_heads/             | layers/layer_norm.py                   | triton             |
| adaptive_layer_norm          | adaptive_layer_norm/          | layers/modulation.py                   | triton             |
| residual_adaptive_layer_norm | residual_adaptive_layer_norm/ | layers/modulation.py                   | triton             |
| swiglu_product               | swiglu_product/               | layers/modulation.py                   | triton             |
| token_mean                   | token_mean/                   | (fastpath) score.py                    | triton             |
| outer_product_mean           | outer_product_mean/           | layers/outer_product_mean.py           | triton             |
| pair_weighted_average        | pair_weighted_average/        | layers/pair_weighted_average.py        | triton             |

In each folder: `__init__.py` registers the op (how to read its token count, its backends, the order
used without a measured table), `<backend>.py` is a backend with the reference's signature and a
`supports(...)` predicate where it takes only some arguments, `triton_kernel.py` the Triton code (imported
lazily). Shared: `cueq.py` (whether cuEquivariance is installed), `triton_support.py` and
`triton_dot_operands.py` (Triton helpers), `crossover.py` with `crossover_sm90.json` (the measured
orders), `token_rows.py` (row blocking the model uses too).
"""

from foldmill.kernels import (  # noqa: F401 - each registers its op
    adaptive_layer_norm,
    attention_pair_bias,
    gated_triangle_attention,
    layer_norm,
    layer_norm_heads,
    outer_product_mean,
    pair_weighted_average,
    residual_adaptive_layer_norm,
    swiglu_product,
    token_mean,
    transition,
    triangle_attention,
    triangle_multiplication,
)
