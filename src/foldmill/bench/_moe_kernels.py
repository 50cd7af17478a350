"""The `kernels` section of `foldmill bench moe`: the memory-bound kernels around the expert GEMMs.

SwiGLU (plain, writing the MXFP8 backend's copies, and storing its input in MXFP8 with the kernels
that read that copy), the 8-bit copies of an expert GEMM's input, output gradient and weights, and
the dequantization of the MXFP8 copy kept for wgrad, at one model's expert shapes, beside a bf16
copy of the same input as the memory-speed reference. Each
kernel is timed in a CUDA graph (these kernels are shorter than their launch from Python). The
bytes counted are those of the tensors each call reads and writes: MXFP8 scales included; routing
probabilities, their gradients and FP8's per-row and per-column scales (a few KiB) left out. The
FP8 quantizer reads its input twice (maxima, then casts), and is counted so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from foldmill.errors import FoldmillError
from foldmill.moe.config import ModelConfig
from foldmill.moe.experts.mxfp8 import (
    along_rows_values,
    gradient_copies,
    input_copies,
    round_trip,
    stored_swiglu_along_rows,
    swiglu_backward_copies,
    swiglu_forward_copies,
    swiglu_forward_storing_input,
)
from foldmill.moe.experts.swiglu import swiglu_backward, swiglu_forward
from foldmill.moe.quant.fp8 import quantize_rows_and_group_columns, quantize_weight_copies


@dataclass(frozen=True)
class KernelCase:
    variant: str
    run: Callable[[], object]
    bytes_moved: int


def check_kernel_tokens(name: str, config: ModelConfig, tokens: int) -> None:
    """The expert rows split evenly over the experts in whole 32-row MXFP8 blocks, or a one-line error."""
    rows, experts = tokens * config.top_k, config.num_experts
    if tokens <= 0 or rows % (32 * experts):
        raise FoldmillError(f"--tokens {tokens}: the kernels section splits {name}'s {rows} expert rows "
                            f"(tokens x top-{config.top_k}) evenly over {experts} experts in blocks of 32; "
                            f"choose tokens with tokens x {config.top_k} a positive multiple of {32 * experts}")


def kernel_cases(config: ModelConfig, tokens: int, device: torch.device | str = "cuda") -> list[KernelCase]:
    """The kernels of one expert MLP at `tokens` tokens (tokens x top_k expert rows, split evenly
    over the experts; check_kernel_tokens holds), on random bf16 data."""
    rows, hidden, ffn, experts = tokens * config.top_k, config.hidden_size, config.ffn_size, config.num_experts
    generator = torch.Generator(device=device).manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device, generator=generator).bfloat16()

    x, dy, h, grad_a = randn(rows, hidden), randn(rows, hidden), randn(rows, 2 * ffn), randn(rows, ffn)
    w13 = randn(experts, 2 * ffn, hidden)
    probs = torch.rand(rows, device=device, generator=generator)
    ends = torch.arange(1, experts + 1, device=device, dtype=torch.int32) * (rows // experts)
    kept = input_copies(x).kept
    stored = swiglu_forward_storing_input(h, probs).stored
    n_x, n_h, n_w = x.numel(), h.numel(), w13.numel()
    return [
        KernelCase("bf16 copy of x (memory-speed reference)", x.clone, 4 * n_x),
        KernelCase("SwiGLU forward", lambda: swiglu_forward(h, probs), 3 * n_h),
        KernelCase("SwiGLU backward", lambda: swiglu_backward(h, probs, grad_a), 5 * n_h),
        KernelCase("SwiGLU forward writing MXFP8 copies", lambda: swiglu_forward_copies(h, probs),
                   2 * n_h + n_h + n_h // 2 + n_h // 64),
        KernelCase("SwiGLU backward writing MXFP8 copies", lambda: swiglu_backward_copies(h, probs, grad_a),
                   2 * n_h + n_h + 4 * n_h),
        KernelCase("SwiGLU forward writing a's copy along F and h's MXFP8 copy (moe.mxfp8_store_swiglu_input)",
                   lambda: swiglu_forward_storing_input(h, probs), 2 * n_h + n_h + n_h + n_h // 32),
        KernelCase("SwiGLU backward from h's MXFP8 copy, writing MXFP8 copies",
                   lambda: swiglu_backward_copies(stored, probs, grad_a), n_h + n_h // 32 + n_h + 4 * n_h),
        KernelCase("a's along-rows MXFP8 copy from h's MXFP8 copy (the second GEMM's wgrad operand)",
                   lambda: stored_swiglu_along_rows(stored), n_h + n_h // 32 + n_h),
        KernelCase("MXFP8 copies of x (values along K, the kept along-rows copy)", lambda: input_copies(x),
                   2 * n_x + 2 * n_x + n_x + n_x // 32),
        KernelCase("MXFP8 copies of dy (values both ways)", lambda: gradient_copies(dy), 2 * n_x + 4 * n_x),
        KernelCase("MXFP8 dequantization of x's kept copy", lambda: along_rows_values(kept), n_x + n_x // 32 + 2 * n_x),
        KernelCase("MXFP8 copies of w13 (values both ways, once per optimizer step)",
                   lambda: round_trip(w13, along_cols=True, along_rows=True), 2 * n_w + 4 * n_w),
        KernelCase("FP8 copies of x (row-wise and per group and column)",
                   lambda: quantize_rows_and_group_columns(x, ends), 2 * 2 * n_x + 2 * n_x),
        KernelCase("FP8 copies of w13 (both layouts, once per optimizer step)", lambda: quantize_weight_copies(w13),
                   2 * 2 * n_w + 2 * n_w),
    ]


def kernel_shape(name: str, config: ModelConfig, tokens: int) -> str:
    return f"{name}: {tokens * config.top_k} expert rows, hidden {config.hidden_size}, FFN {config.ffn_size}"
