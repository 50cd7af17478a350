"""The Triton kernel behind foldmill.kernels.outer_product_mean.triton (imports triton: load it lazily).

One program computes one (BLOCK_I tokens x C channels) x (BLOCK_J tokens x C channels) tile of the
outer-product sum P[i, c, j, d] = sum_s a[s, i, c] b[s, j, d], walking the MSA rows s in BLOCK_S
steps on the tensor cores (fp32 accumulation), and stores it straight into the (rows, N, C * C)
layout the output projection reads (out[i, j, c * C + d]). PyTorch's einsum produces (i, c, j, d)
instead, which then costs a permuting copy, and the mean's division and two dtype casts are more
full passes over that (rows, N, 1,024) tensor.

a and b are (B, S, N, C) with the channel axis contiguous and tokens C apart, so an A or B tile's
row (one MSA row s) is BLOCK_I * C contiguous elements. Programs of one column block j run
together over every row block of the call, so each b column strip is read from HBM once per call.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from foldmill.kernels.triton_dot_operands import dot_operand, rounded
from foldmill.kernels.triton_support import dot_flags


@dataclass(frozen=True)
class BlockConfig:
    """Tokens per tile side (rows i, columns j), MSA rows per step, warps, pipeline stages."""

    block_i: int
    block_j: int
    block_s: int
    num_warps: int
    num_stages: int


# sm_90 candidates for C = 32, the default first; a narrower C scales the token counts so the tiles
# keep their width (see config_for). Measured on the H200 with 2,048 MSA rows, the
# 128 x 256 tile won at every size: 7.4 / 28.3 / 64.9 ms per call at 849 / 1,672 / 2,472 tokens,
# against 8.0 / 30.8 / 68.1 for 256 x 128 and 8.3 / 30.0 / 69.7 for 128 x 128 at 4 warps. One
# configuration runs (no autotuning: each extra candidate costs every new process a compilation).
CONFIGS = (BlockConfig(4, 8, 64, 8, 3), BlockConfig(8, 4, 64, 8, 3), BlockConfig(4, 4, 64, 4, 4))
TILE_CHANNELS = 32  # the C the token counts above are for


def config_for(channels: int, config: BlockConfig | None = None) -> BlockConfig:
    """`config` (CONFIGS[0] by default), its token counts scaled to keep the tile widths at `channels`."""
    config = config or CONFIGS[0]
    scale = TILE_CHANNELS // channels
    return BlockConfig(
        config.block_i * scale, config.block_j * scale, config.block_s, config.num_warps, config.num_stages
    )


@triton.jit(do_not_specialize=["msa_rows", "tokens", "row_start", "rows"])  # one compilation for all sizes
def _outer_product_kernel(
    a_ptr,
    b_ptr,
    out_ptr,
    msa_rows,
    tokens,
    row_start,
    rows,
    a_stride_b,
    a_stride_s,
    b_stride_b,
    b_stride_s,
    out_stride_b,
    C: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_J: tl.constexpr,
    BLOCK_S: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    EMULATE_BF16: tl.constexpr,
):
    TILE_M: tl.constexpr = BLOCK_I * C
    TILE_N: tl.constexpr = BLOCK_J * C
    row_blocks = tl.cdiv(rows, BLOCK_I)
    pid = tl.program_id(0)
    row_block = pid % row_blocks  # the row blocks of one column block run together (b from HBM once)
    column_block = pid // row_blocks
    batch = tl.program_id(1).to(tl.int64)

    m = tl.arange(0, TILE_M)  # (token i, channel c) of the tile's rows
    n = tl.arange(0, TILE_N)  # (token j, channel d) of its columns
    row = row_block * BLOCK_I + m // C  # token i within this call's rows
    column = column_block * BLOCK_J + n // C
    row_ok = row < rows
    column_ok = column < tokens
    a_tile = a_ptr + batch * a_stride_b + (row_start + row) * C + m % C
    b_tile = b_ptr + batch * b_stride_b + column * C + n % C

    acc = tl.zeros((TILE_M, TILE_N), dtype=tl.float32)
    for start in range(0, msa_rows, BLOCK_S):
        s = start + tl.arange(0, BLOCK_S)
        s_ok = s < msa_rows
        a = tl.load(a_tile[None, :] + s[:, None].to(tl.int64) * a_stride_s, mask=s_ok[:, None] & row_ok[None, :], other=0.0)
        b = tl.load(b_tile[None, :] + s[:, None].to(tl.int64) * b_stride_s, mask=s_ok[:, None] & column_ok[None, :], other=0.0)
        acc = tl.dot(tl.trans(dot_operand(a, EMULATE_BF16)), dot_operand(b, EMULATE_BF16), acc, input_precision=DOT_PRECISION)

    # out[b, i, j, c * C + d]: separable into a row part (i, c) and a column part (j, d).
    dtype = out_ptr.dtype.element_ty
    row_offset = row.to(tl.int64) * tokens * C * C + (m % C) * C
    column_offset = column * C * C + n % C
    out = rounded(acc, dtype, EMULATE_BF16).to(dtype)  # 2nd cast: interpreter only
    tl.store(
        out_ptr + batch * out_stride_b + row_offset[:, None] + column_offset[None, :],
        out,
        mask=row_ok[:, None] & column_ok[None, :],
    )


def outer_product_sum(
    a: Tensor, b: Tensor, row_start: int, rows: int, compute_dtype: torch.dtype, config: BlockConfig | None = None
) -> Tensor:
    """P (B, rows, N, C * C) in `compute_dtype`: P[:, i, j, c * C + d] = sum_s a[:, s, row_start + i, c] b[:, s, j, d].

    a, b: (B, S, N, C), C a power of two in [16, 32]; copied only if their last two axes are not
    contiguous or their dtype is not the compute dtype. CPU tensors run Triton's interpreter.
    """
    batch, msa_rows, tokens, channels = b.shape
    a, b = (
        t if t.dtype == compute_dtype and t.stride(-1) == 1 and t.stride(-2) == channels else t.to(compute_dtype).contiguous()
        for t in (a, b)
    )
    out = torch.empty(batch, rows, tokens, channels * channels, device=a.device, dtype=compute_dtype)
    if out.numel() == 0:
        return out
    config = config_for(channels, config)
    grid = (triton.cdiv(rows, config.block_i) * triton.cdiv(tokens, config.block_j), batch)
    _outer_product_kernel[grid](
        a,
        b,
        out,
        msa_rows,
        tokens,
        row_start,
        rows,
        a.stride(0),
        a.stride(1),
        b.stride(0),
        b.stride(1),
        out.stride(0),
        C=channels,
        BLOCK_I=config.block_i,
        BLOCK_J=config.block_j,
        BLOCK_S=config.block_s,
        **dot_flags(a.device, compute_dtype),
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    return out
