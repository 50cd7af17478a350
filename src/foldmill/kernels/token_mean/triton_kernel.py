"""The Triton kernel behind the "token_mean" op (imports triton: load it lazily): one program per
(sample row, token, feature block) sums the token's atoms, which are contiguous, in a fixed order
(deterministic, unlike atomics), times 1 / (count + 1e-6)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

TOKEN_BLOCK_D = 256


@triton.jit
def _token_mean_kernel(
    x_ptr,
    start_ptr,
    inverse_count_ptr,
    out_ptr,
    samples,
    atoms,
    tokens,
    width,
    MAX_ATOMS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    sample_row = tl.program_id(0).to(tl.int64)
    token = tl.program_id(1)
    column = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    column_ok = column < width
    record = sample_row // samples
    first = tl.load(start_ptr + record * (tokens + 1) + token)
    end = tl.load(start_ptr + record * (tokens + 1) + token + 1)
    total = tl.zeros((BLOCK_D,), dtype=tl.float32)
    base = x_ptr + sample_row * atoms * width
    for offset in range(0, MAX_ATOMS):
        atom = first + offset
        value = tl.load(base + atom * width + column, mask=column_ok & (atom < end), other=0.0)
        total += value.to(tl.float32)
    weight = tl.load(inverse_count_ptr + record * tokens + token)
    out = out_ptr + (sample_row * tokens + token) * width + column
    tl.store(out, total * weight, mask=column_ok)


def token_mean(x: Tensor, starts: Tensor, inverse_counts: Tensor, samples: int, max_atoms: int) -> Tensor:
    """x: (B * samples, N, D) contiguous; starts: (B, T + 1) int32, a token's atoms being
    starts[t]:starts[t+1]; inverse_counts: (B, T) fp32 -> (B * samples, T, D) fp32."""
    rows, atoms, width = x.shape
    tokens = inverse_counts.shape[1]
    out = torch.empty((rows, tokens, width), device=x.device, dtype=torch.float32)
    grid = (rows, tokens, triton.cdiv(width, TOKEN_BLOCK_D))
    _token_mean_kernel[grid](
        x,
        starts,
        inverse_counts,
        out,
        samples,
        atoms,
        tokens,
        width,
        MAX_ATOMS=1 << (max(1, max_atoms) - 1).bit_length(),  # powers of two: few compilations
        BLOCK_D=TOKEN_BLOCK_D,
        num_warps=4,
    )
    return out
