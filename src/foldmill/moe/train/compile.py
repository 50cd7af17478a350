"""torch.compile of the dense sub-blocks of every decoder layer: attention and the router (config
moe.compile, off by default). On GPUs the norms and the residual adds before them run as foldmill's
fused kernel (moe/kernels/rms_norm.py) either way.

On the H200 (bio_8x1b, 2 x 4,096 tokens, bf16) the step ran slower with these sub-blocks compiled
in each of the last eight benchmark runs (129.15 ms against 124.59 in the latest), so it is not the
default (docs/benchmarks/moe.md). Compiling whole layers instead gave 142 vs 148 ms: the
experts' routing has data-dependent sizes and their weight caches key on tensor identity, so the
graph breaks there. The experts keep their own kernels (grouped GEMMs, Triton SwiGLU).
`nn.Module.compile` compiles in place, so parameter names (and checkpoints) are unchanged."""

from __future__ import annotations

from torch import nn


def compile_dense_blocks(model: nn.Module) -> nn.Module:
    for layer in model.layers:
        for block in (layer.attention, layer.moe.router):
            block.compile()
    return model
