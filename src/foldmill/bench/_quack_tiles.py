"""The `quack-tiles` section of `foldmill bench moe`: tile configurations of the quack backend's
two epilogue GEMMs, the gated forward (h and the SwiGLU from one GEMM) and the dgated backward,
and its plain GEMMs on QuACK against torch's.

The backend runs QuACK's default tiles unless another configuration was measured faster for the
GPU and expert shape (`quack_fused.MEASURED_TILES`); this section is that measurement. At
one model's expert shape, the step's tokens routed evenly, it times each GEMM under QuACK's default
and under every sm90 configuration QuACK's autotuner tries, beside what the `grouped` backend runs
in its place (torch's `grouped_mm`, then foldmill's SwiGLU kernel). Each configuration compiles
once, a few seconds, and QuACK keeps it in its disk cache. The plain GEMMs (a @ w2, and x's and
w13's gradients from grad_h) run on QuACK's default tiles and on torch's `grouped_mm`, grad_h
copied into [gate | up] for torch: the measurement behind `quack_fused.TORCH_PLAIN_GEMMS`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch

from foldmill.moe.config import ModelConfig
from foldmill.moe.experts.quack_fused import (
    QuackCalls,
    QuackEpilogueCalls,
    calls_for_experts,
    dgated_gemm,
    gated_gemm,
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
    """The gated and dgated GEMMs of one expert MLP at `tokens` tokens (tokens x top_k rows, split
    evenly over the experts, the remainder to the last), and its plain GEMMs on QuACK and on torch,
    on random bf16 data."""
    from quack.gemm_config import get_all_configs

    rows, hidden, ffn, experts = tokens * config.top_k, config.hidden_size, config.ffn_size, config.num_experts
    generator = torch.Generator(device=device).manual_seed(0)

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, device=device, generator=generator) * scale).bfloat16()

    x, dy, h = randn(rows, hidden), randn(rows, hidden), randn(rows, 2 * ffn)
    w13, w2 = randn(experts, 2 * ffn, hidden, scale=hidden**-0.5), randn(experts, hidden, ffn, scale=ffn**-0.5)
    probs = torch.rand(rows, device=device, generator=generator)
    ends = torch.full((experts,), rows // experts, dtype=torch.int32, device=device).cumsum(0, dtype=torch.int32)
    ends[-1] = rows
    offsets = row_offsets(ends)
    gated_flops, dgated_flops = 2 * rows * hidden * 2 * ffn, 2 * rows * hidden * ffn
    chosen = {kernel: tile_config(kernel, torch.device(device), hidden, ffn) for kernel in ("gated", "dgated")}

    cases = [
        TileCase("gated: grouped_mm, then the SwiGLU kernel (grouped backend)",
                 lambda: swiglu_forward(torch._grouped_mm(x, w13.mT, offs=ends), probs), gated_flops),
        TileCase("dgated: grouped_mm, then the SwiGLU backward kernel (grouped backend)",
                 lambda: swiglu_backward(h, probs, torch._grouped_mm(dy, w2, offs=ends)), dgated_flops),
        TileCase("gated: QuACK default tiles", lambda: gated_gemm(x, w13, probs, offsets), gated_flops),
        TileCase("dgated: QuACK default tiles", lambda: dgated_gemm(dy, w2, h, probs, offsets), dgated_flops),
    ]
    # The autotuner's candidates for epilogues that work on column pairs, on this GPU's architecture.
    major = torch.cuda.get_device_capability(device)[0]
    for tiles in (c for c in get_all_configs(epilogue="gated") if c.device_capacity == major):
        name = (f"{tiles.tile_m}x{tiles.tile_n} {'pingpong' if tiles.pingpong else 'cooperative'}, "
                f"cluster {tiles.cluster_m}x{tiles.cluster_n}")
        marks = {kernel: " (the backend's choice)" if tiles == config else "" for kernel, config in chosen.items()}
        cases.append(TileCase(f"gated: {name}{marks['gated']}",
                              lambda tiles=tiles: gated_gemm(x, w13, probs, offsets, tiles), gated_flops))
        cases.append(TileCase(f"dgated: {name}{marks['dgated']}",
                              lambda tiles=tiles: dgated_gemm(dy, w2, h, probs, offsets, tiles), dgated_flops))
    # The plain GEMMs both ways; h's shape and values stand in for grad_h.
    a = randn(rows, ffn)
    chosen_calls = calls_for_experts(x, hidden, ffn)
    for calls, how in ((QuackCalls, "QuACK default tiles"),
                       (QuackEpilogueCalls, "torch grouped_mm, grad_h copied into [gate | up]")):
        mark = " (the backend's choice)" if calls is chosen_calls else ""
        cases.append(TileCase(f"a @ w2: {how}{mark}", lambda calls=calls: calls.linear(a, w2, offsets),
                              dgated_flops))
        cases.append(TileCase(f"x's and w13's gradients from grad_h: {how}{mark}",
                              lambda calls=calls: calls.gated_gradients(h, w13, x, offsets), 2 * gated_flops))
    # The first four again: how far the GPU's timings drift over the section (clocks, temperature).
    return cases + [dataclasses.replace(case, variant=f"{case.variant}, again") for case in cases[:4]]

