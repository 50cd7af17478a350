"""Triton float32 router logits x @ w.T and their gradients, streaming x with plain FMAs.

In the bf16-mixed recipe the router's x (tokens, hidden) and weight (experts, hidden) are float32.
cuBLAS ran these products as float32 GEMMs with 8 output columns on CUDA cores: on an H200 at
8,192 tokens x hidden 2,048, 51 us forward and 115 us backward (dx and dw) per layer, where copying
x (reading and writing it) takes 36 us. With few experts the work is memory-bound, so each kernel
reads x once and multiplies-adds in registers (tl.dot in float32 IEEE precision measured far slower
here): 28 us forward, about 50 us backward, 74 us both ways in a CUDA graph against cuBLAS's 154.
With many experts the FMAs bound the work, and cuBLAS is as fast or faster; the router keeps it
there (model/router.py).

Forward, each program takes BLOCK_T tokens and keeps a (BLOCK_T, E_BLOCK, BLOCK_K) float32
accumulator over hidden chunks of BLOCK_K, summed over its K axis once at the end. Backward, one
kernel reads each (BLOCK_T tokens, BLOCK_K hidden) tile of x once, SUB_T tokens at a time, and
writes that tile of dx = g @ w and the tile's share of dw = g.T @ x; torch adds the token blocks'
shares in a fixed order, so every run gives the same bits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from foldmill.moe.kernels.grid import cdiv, next_power_of_2


@triton.jit
def _router_logits_kernel(x_ptr, w_ptr, logits_ptr, tokens, hidden, num_experts, E_BLOCK: tl.constexpr,
                          BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr):
    """logits[t, e] = sum_k x[t, k] * w[e, k] for the program's BLOCK_T tokens."""
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    experts = tl.arange(0, E_BLOCK)
    cols = tl.arange(0, BLOCK_K)
    row_ok = rows < tokens
    expert_ok = experts < num_experts
    x_rows = x_ptr + rows[:, None, None].to(tl.int64) * hidden
    w_rows = w_ptr + experts[None, :, None] * hidden
    acc = tl.zeros((BLOCK_T, E_BLOCK, BLOCK_K), dtype=tl.float32)
    # STAGES chunks of x in flight (through shared memory): one at a time reached 1.9 TB/s, not 2.4.
    for start in tl.range(0, hidden, BLOCK_K, num_stages=STAGES):
        k = start + cols[None, None, :]
        # w first: the accumulator then takes the layout of x's load (the later one), each thread
        # holding every expert of its (token, column) elements, so x is used where it was loaded.
        w = tl.load(w_rows + k, mask=expert_ok[None, :, None] & (k < hidden), other=0.0)
        x = tl.load(x_rows + k, mask=row_ok[:, None, None] & (k < hidden), other=0.0)
        acc += x * w
    logits = tl.sum(acc, axis=2)
    offs = rows[:, None].to(tl.int64) * num_experts + experts[None, :]
    tl.store(logits_ptr + offs, logits, mask=row_ok[:, None] & expert_ok[None, :])


@triton.jit
def _router_logits_backward_kernel(x_ptr, w_ptr, grad_ptr, dx_ptr, partial_ptr, tokens, hidden, num_experts,
                                   E_BLOCK: tl.constexpr, BLOCK_T: tl.constexpr, SUB_T: tl.constexpr,
                                   BLOCK_K: tl.constexpr):
    """For the tile of BLOCK_T tokens x BLOCK_K hidden columns, taken SUB_T tokens at a time:
    dx[t, k] = sum_e g[t, e] * w[e, k], and partial[program_t, e, k] = sum_t g[t, e] * x[t, k]."""
    first = tl.program_id(0) * BLOCK_T
    experts = tl.arange(0, E_BLOCK)
    cols = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    expert_ok = experts < num_experts
    col_ok = cols < hidden
    w = tl.load(w_ptr + experts[None, :, None] * hidden + cols[None, None, :],
                mask=expert_ok[None, :, None] & col_ok[None, None, :], other=0.0)
    acc = tl.zeros((SUB_T, E_BLOCK, BLOCK_K), dtype=tl.float32)
    # Not software-pipelined: staging x through shared memory here was several times slower.
    for sub in range(0, BLOCK_T, SUB_T):
        rows = first + sub + tl.arange(0, SUB_T)
        row_ok = rows < tokens
        g = tl.load(grad_ptr + rows[:, None, None].to(tl.int64) * num_experts + experts[None, :, None],
                    mask=row_ok[:, None, None] & expert_ok[None, :, None], other=0.0)
        offs = rows[:, None, None].to(tl.int64) * hidden + cols[None, None, :]
        mask = row_ok[:, None, None] & col_ok[None, None, :]
        x = tl.load(x_ptr + offs, mask=mask, other=0.0)
        dx = tl.sum(g * w, axis=1, keep_dims=True)
        tl.store(dx_ptr + offs, dx, mask=mask)
        acc += g * x
    partial = tl.sum(acc, axis=0)
    offs = (tl.program_id(0) * num_experts + experts[:, None]).to(tl.int64) * hidden + cols[None, :]
    tl.store(partial_ptr + offs, partial, mask=expert_ok[:, None] & col_ok[None, :])


# Both kernels read x in chunks of _BLOCK_K columns, 16 threads of a warp side by side, 4 floats
# each, and two tokens a warp; each thread holds all E_BLOCK experts of its elements. Forward:
# _WARPS warps, 64 accumulator floats a thread (16 tokens a program at 8 experts), _STAGES chunks
# in flight. Backward: _BACKWARD_WARPS warp, 128 floats a thread (SUB_T = 8 at 8 experts; more
# spilled registers), and up to _BACKWARD_BLOCK_T tokens a program, fewer where that leaves under
# _TOKEN_BLOCKS blocks for the GPU: the weight gradient's shares take 2 MB at 8,192 tokens, 8
# experts, hidden 2,048. Chosen on an H200 at that shape: more warps a program, more accumulator
# floats a thread, or wider chunks were slower.
_BLOCK_K = 64
_WARPS, _STAGES = 4, 4
_BACKWARD_WARPS, _BACKWARD_BLOCK_T, _TOKEN_BLOCKS = 1, 256, 32


def _expert_block(num_experts: int) -> int:
    return max(next_power_of_2(num_experts), 2)


def _forward_constants(num_experts: int) -> dict:
    e_block = _expert_block(num_experts)
    return {"E_BLOCK": e_block, "BLOCK_T": max(128 // e_block, 8), "BLOCK_K": _BLOCK_K, "STAGES": _STAGES}


def _backward_constants(tokens: int, num_experts: int) -> dict:
    e_block = _expert_block(num_experts)
    sub_t = max(64 // e_block, 2)
    block_t = max(sub_t, min(_BACKWARD_BLOCK_T, next_power_of_2(cdiv(tokens, _TOKEN_BLOCKS))))
    return {"E_BLOCK": e_block, "BLOCK_T": block_t, "SUB_T": sub_t, "BLOCK_K": _BLOCK_K}


class RouterLogits(torch.autograd.Function):
    """x (tokens, hidden) and weight (experts, hidden), float32 -> logits (tokens, experts) float32."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        x, weight = x.contiguous(), weight.contiguous()
        (tokens, hidden), num_experts = x.shape, weight.shape[0]
        constants = _forward_constants(num_experts)
        logits = torch.empty(tokens, num_experts, dtype=x.dtype, device=x.device)
        _router_logits_kernel[(cdiv(tokens, constants["BLOCK_T"]),)](
            x, weight, logits, tokens, hidden, num_experts, **constants, num_warps=_WARPS)
        ctx.save_for_backward(x, weight)
        return logits

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, weight = ctx.saved_tensors
        (tokens, hidden), num_experts = x.shape, weight.shape[0]
        constants = _backward_constants(tokens, num_experts)
        token_blocks = cdiv(tokens, constants["BLOCK_T"])
        grad_x = torch.empty_like(x)
        partials = torch.empty(token_blocks, num_experts, hidden, dtype=x.dtype, device=x.device)
        _router_logits_backward_kernel[(token_blocks, cdiv(hidden, _BLOCK_K))](
            x, weight, grad.contiguous(), grad_x, partials, tokens, hidden, num_experts, **constants,
            num_warps=_BACKWARD_WARPS)
        return grad_x, partials.sum(dim=0)


def router_logits_triton(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return RouterLogits.apply(x, weight)
