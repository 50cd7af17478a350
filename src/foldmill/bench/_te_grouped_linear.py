"""Transformer Engine's GroupedLinear, a contender in the gemm section of `foldmill bench moe`.

Transformer Engine (TE) is NVIDIA's library of FP8 training layers, and `GroupedLinear` is its MoE
expert linear layer: one GEMM per expert over a split of the rows. Its Hopper recipes are the
reference points for foldmill's 8-bit backends: per-tensor current scaling, and block scaling
(1 x 128 tiles for activations and gradients, 128 x 128 for weights, as DeepSeek-V3 trains), which
torch's scaled grouped GEMM refuses on sm_90. TE runs the experts either through cuBLASLt's grouped
GEMM (cuBLAS 13.4 and newer on Hopper, 13.6 for block scaling) or, with older cuBLAS, one cuBLAS
GEMM per expert; each row names the path it took.

The layer gets the bench's weights and row counts; its weights' 8-bit copies are made once and
reused (`is_first_microbatch`), as foldmill's rows reuse theirs between optimizer steps.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import transformer_engine.pytorch as te
from transformer_engine.common import recipe as te_recipe
from transformer_engine.pytorch.module.grouped_linear import is_module_grouped_tensor_path_supported


def recipes() -> list[tuple[str, te_recipe.Recipe | None, str]]:
    """(label, TE recipe or None for bf16, the precision whose peak the row is held against)."""
    return [("bf16", None, "bf16"),
            ("fp8 per-tensor current scaling", te_recipe.Float8CurrentScaling(), "fp8"),
            ("fp8 block scaling 1x128 / 128x128", te_recipe.Float8BlockScaling(), "fp8")]


def grouped_linear(w: torch.Tensor, ends: torch.Tensor, recipe: te_recipe.Recipe | None, native: bool
                   ) -> Callable[[torch.Tensor], torch.Tensor]:
    """A GroupedLinear holding w (experts, n, k), called on rows split at ends; native: through
    cuBLASLt's grouped GEMM, else one GEMM per expert. Its weights' copies are made on the first call."""
    experts, n, k = w.shape
    layer = te.GroupedLinear(experts, k, n, bias=False, params_dtype=torch.bfloat16, device=w.device,
                             use_grouped_tensor=native)
    with torch.no_grad():
        for expert in range(experts):
            getattr(layer, f"weight{expert}").copy_(w[expert])
    counts = torch.diff(ends.long(), prepend=ends.new_zeros(1).long())
    # The native path reads the split on the GPU; the per-expert path needs it on the host.
    splits = counts if native else counts.cpu()
    first = [True]

    def call(x: torch.Tensor) -> torch.Tensor:
        with te.autocast(enabled=recipe is not None, recipe=recipe):
            y = layer(x, splits, is_first_microbatch=first[0])
        first[0] = False
        return y

    call.layer = layer
    return call


def transformer_engine_rows(record: Callable[..., None], error_against: Callable[..., dict], x: torch.Tensor,
                            w: torch.Tensor, dy: torch.Tensor, ends: torch.Tensor) -> None:
    """Forward, and forward + backward, of TE's GroupedLinear per recipe the GPU supports. Both run
    as training does (the forward keeps what the backward needs). error_against(run, want): the
    forward row's error column against the float32 product."""
    import torch.nn.functional as F

    want = F.grouped_mm(x.float(), w.float().transpose(-2, -1), offs=ends)
    for label, recipe, precision in recipes():
        try:
            if recipe is not None and not _supported(recipe):
                continue
            native = is_module_grouped_tensor_path_supported(recipe, torch.bfloat16)
        except Exception as error:  # TE cannot tell what this GPU runs: one row with its error
            record(f"Transformer Engine GroupedLinear {label}", None, precision, failure=error)
            continue
        path = "cuBLASLt grouped GEMM" if native else "a cuBLAS GEMM per expert"
        built: dict = {}
        x_leaf = x.detach().requires_grad_()

        def build(recipe=recipe, native=native, built=built, x_leaf=x_leaf) -> dict:
            built["call"] = grouped_linear(w, ends, recipe, native)
            return error_against(lambda: built["call"](x_leaf).detach(), lambda: want)

        def forward(built=built, x_leaf=x_leaf) -> torch.Tensor:
            return built["call"](x_leaf)

        def forward_backward(built=built, x_leaf=x_leaf) -> None:
            built["call"](x_leaf).backward(dy)
            x_leaf.grad = None
            built["call"].layer.zero_grad(set_to_none=True)

        record(f"Transformer Engine GroupedLinear {label} forward ({path})", forward, precision, check=build)
        if built:
            record(f"Transformer Engine GroupedLinear {label} forward + backward ({path})", forward_backward,
                   precision, passes=3)
        built.clear()


def _supported(recipe: te_recipe.Recipe) -> bool:
    """Whether TE runs this FP8 recipe on this GPU (block scaling needs Hopper or newer)."""
    if isinstance(recipe, te_recipe.Float8BlockScaling):
        return bool(te.is_fp8_block_scaling_available())
    return bool(te.is_fp8_available())
