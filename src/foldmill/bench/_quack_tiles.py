"""The `quack-tiles` section of `foldmill bench moe`: tile configurations of the quack backend's
GEMMs. Two carry the SwiGLU in their epilogues, the gated forward (h and the SwiGLU from one GEMM)
and the dgated backward; four are plain: a @ w2 (down), w2's gradient, and x's and w13's
gradients from the interleaved grad_h.

The backend runs QuACK's default tiles unless another configuration was measured faster for the
GPU and expert shape (`quack_fused.MEASURED_TILES`); this section is that measurement. At
one model's expert shape, the step's tokens routed evenly, it times each GEMM under QuACK's default
and under every sm90 configuration QuACK's autotuner tries, beside what the `grouped` backend runs
in its place (torch's `grouped_mm`, then foldmill's SwiGLU kernel for the epilogue GEMMs). Each
configuration compiles once, a few seconds, and QuACK keeps it in its disk cache.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch

from foldmill.moe.config import ModelConfig
from foldmill.moe.experts.quack_fused import (
    TorchCalls,
    dgated_gemm,
    down_gemm,
    gated_gemm,
    grad_w2_gemm,
    grad_w13_gemm,
    grad_x_gemm,
    row_offsets,
    tile_config,
)
from foldmill.moe.experts.swiglu import swiglu_backward, swiglu_forward


@dataclass(frozen=True)
class TileCase:
    variant: str
    run: Callable[[], object]
    flops: int


def tile_cases(config: ModelConfig, tokens: int, device: torch.device | str = "cuda") -> list[TileCase]:
    """The GEMMs of one expert MLP at `tokens` tokens (tokens x top_k rows, split evenly over the
    experts, the remainder to the last) under each tile configuration, on random bf16 data; h's
    shape and values stand in for grad_h's."""
    from quack.gemm_config import get_all_configs

    rows, hidden, ffn, experts = tokens * config.top_k, config.hidden_size, config.ffn_size, config.num_experts
    generator = torch.Generator(device=device).manual_seed(0)

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, device=device, generator=generator) * scale).bfloat16()

    x, dy, h, a = randn(rows, hidden), randn(rows, hidden), randn(rows, 2 * ffn), randn(rows, ffn)
    w13, w2 = randn(experts, 2 * ffn, hidden, scale=hidden**-0.5), randn(experts, hidden, ffn, scale=ffn**-0.5)
    probs = torch.rand(rows, device=device, generator=generator)
    ends = torch.full((experts,), rows // experts, dtype=torch.int32, device=device).cumsum(0, dtype=torch.int32)
    ends[-1] = rows
    offsets = row_offsets(ends)
    flops = 2 * rows * hidden * ffn  # of a GEMM over one of gate, up and a
    # kernel: (what the grouped backend runs instead, QuACK's call given tiles, FLOPs)
    kernels = {
        "gated": (lambda: swiglu_forward(TorchCalls.linear(x, w13, offsets), probs),
                  lambda tiles: gated_gemm(x, w13, probs, offsets, tiles), 2 * flops),
        "dgated": (lambda: swiglu_backward(h, probs, TorchCalls.dgrad(dy, w2, offsets)),
                   lambda tiles: dgated_gemm(dy, w2, h, probs, offsets, tiles), flops),
        "down": (lambda: TorchCalls.down(a, w2, offsets), lambda tiles: down_gemm(a, w2, offsets, tiles), flops),
        "grad_w2": (lambda: TorchCalls.grad_w2(dy, a, offsets), lambda tiles: grad_w2_gemm(dy, a, offsets, tiles),
                    flops),
        "grad_x": (lambda: TorchCalls.dgrad(h, w13, offsets), lambda tiles: grad_x_gemm(h, w13, offsets, tiles),
                   2 * flops),
        "grad_w13": (lambda: TorchCalls.wgrad(h, x, offsets), lambda tiles: grad_w13_gemm(h, x, offsets, tiles),
                     2 * flops),
    }
    grouped_names = {"gated": "grouped_mm, then the SwiGLU kernel", "dgated": "grouped_mm, then the SwiGLU backward kernel"}
    major = torch.cuda.get_device_capability(device)[0]
    cases = []
    for kernel, (grouped, quack, kernel_flops) in kernels.items():
        chosen = tile_config(kernel, torch.device(device), hidden, ffn)
        mark = " (the backend's choice)" if chosen is None else ""
        cases += [TileCase(f"{kernel}: {grouped_names.get(kernel, 'grouped_mm')} (grouped backend)", grouped,
                           kernel_flops),
                  TileCase(f"{kernel}: QuACK default tiles{mark}", lambda quack=quack: quack(None), kernel_flops)]
        # The autotuner's candidates on this GPU's architecture: for the epilogue GEMMs those that
        # work on column pairs; no swapped operands, which grouped rows rule out.
        epilogue = "gated" if kernel in ("gated", "dgated") else None
        for tiles in get_all_configs(epilogue=epilogue):
            if tiles.device_capacity != major or tiles.swap_ab:
                continue
            name = (f"{tiles.tile_m}x{tiles.tile_n} {'pingpong' if tiles.pingpong else 'cooperative'}, "
                    f"cluster {tiles.cluster_m}x{tiles.cluster_n}")
            mark = " (the backend's choice)" if tiles == chosen else ""
            cases.append(TileCase(f"{kernel}: {name}{mark}", lambda quack=quack, tiles=tiles: quack(tiles),
                                  kernel_flops))
    # The first cases again: how far the GPU's timings drift over the section (clocks, temperature).
    return cases + [dataclasses.replace(case, variant=f"{case.variant}, again") for case in cases[:2]]
