"""The Triton kernel behind foldmill.kernels.pair_weighted_average.triton (imports triton: load it lazily).

Per (batch, head) the pair-weighted average is one matrix product shared by every MSA row:
O[i, (s, d)] = sum_j W[i, j] V[j, (s, d)], with W the head's (N, N) softmax weights and V the
values v[s, j, h, d]. One program computes a BLOCK_I x (BLOCK_S rows s x D channels) tile of O,
walking the tokens j in BLOCK_J steps on the tensor cores (fp32 accumulation), and multiplies it
by sigmoid(gate) before storing it in the MSA layout out[s, i, h, d]. The values and the gate are
read in place from their (B, S, N, H * D) projections (any token and row strides); PyTorch's
einsum instead copies the values into (h, j, (s, d)) and its result back out of (h, i, (s, d)),
then multiplies by the gate in another pass.

Programs of one (s, d) column strip run together over every row block i, so the strip (the
values of BLOCK_S MSA rows) comes from HBM once per head; the head's weights (12 MB at 2,472
tokens in bf16) stay in L2.
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
    """Tokens i per tile, MSA rows s per tile (times D channels), tokens j per step, warps, stages."""

    block_i: int
    block_s: int
    block_j: int
    num_warps: int
    num_stages: int


# sm_90 candidates for D = 32 (Boltz-2's c_h), the default first. Tiles of 128 x 128 and 128 x 256.
CONFIGS = (BlockConfig(128, 4, 64, 8, 3), BlockConfig(128, 8, 64, 8, 3), BlockConfig(64, 4, 64, 4, 4))


@triton.jit(do_not_specialize=["msa_rows", "tokens"])  # one compilation for all sizes
def _pair_average_kernel(
    weights_ptr,
    values_ptr,
    gate_ptr,
    out_ptr,
    msa_rows,
    tokens,
    weights_stride_b,
    weights_stride_h,
    weights_stride_i,
    values_stride_b,
    values_stride_s,
    values_stride_j,
    gate_stride_b,
    gate_stride_s,
    gate_stride_i,
    out_stride_b,
    out_stride_s,
    out_stride_i,
    HEADS: tl.constexpr,
    D: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_J: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    EMULATE_BF16: tl.constexpr,
):
    TILE_N: tl.constexpr = BLOCK_S * D
    row_blocks = tl.cdiv(tokens, BLOCK_I)
    pid = tl.program_id(0)
    row_block = pid % row_blocks  # the row blocks of one (s, d) strip run together (its values from HBM once)
    strip = pid // row_blocks
    batch_head = tl.program_id(1)
    batch = (batch_head // HEADS).to(tl.int64)
    head = (batch_head % HEADS).to(tl.int64)

    i = row_block * BLOCK_I + tl.arange(0, BLOCK_I)
    n = tl.arange(0, TILE_N)  # (MSA row s, channel d) of the tile's columns
    s = (strip * BLOCK_S + n // D).to(tl.int64)
    d = n % D
    i_ok = i < tokens
    s_ok = s < msa_rows
    weights_rows = weights_ptr + batch * weights_stride_b + head * weights_stride_h + i[:, None].to(tl.int64) * weights_stride_i
    values_columns = values_ptr + batch * values_stride_b + s * values_stride_s + head * D + d

    acc = tl.zeros((BLOCK_I, TILE_N), dtype=tl.float32)
    for start in range(0, tokens, BLOCK_J):
        j = start + tl.arange(0, BLOCK_J)
        j_ok = j < tokens
        w = tl.load(weights_rows + j[None, :], mask=i_ok[:, None] & j_ok[None, :], other=0.0)
        v = tl.load(values_columns[None, :] + j[:, None].to(tl.int64) * values_stride_j, mask=j_ok[:, None] & s_ok[None, :], other=0.0)
        acc = tl.dot(dot_operand(w, EMULATE_BF16), dot_operand(v, EMULATE_BF16), acc, input_precision=DOT_PRECISION)

    dtype = out_ptr.dtype.element_ty
    store_ok = i_ok[:, None] & s_ok[None, :]
    i64 = i[:, None].to(tl.int64)
    gate = tl.load(
        gate_ptr + batch * gate_stride_b + i64 * gate_stride_i + (s * gate_stride_s + head * D + d)[None, :],
        mask=store_ok,
        other=0.0,
    )
    out = rounded(acc, dtype, EMULATE_BF16).to(tl.float32) * tl.sigmoid(gate.to(tl.float32))
    out = rounded(out, dtype, EMULATE_BF16).to(dtype)  # 2nd cast: interpreter only
    tl.store(out_ptr + batch * out_stride_b + i64 * out_stride_i + (s * out_stride_s + head * D + d)[None, :], out, mask=store_ok)


def pair_weighted_average(
    weights: Tensor, values: Tensor, gate: Tensor, compute_dtype: torch.dtype, config: BlockConfig | None = None
) -> Tensor:
    """sigmoid(gate) * (per head, sum_j weights[h, i, j] values[s, j, h, :]): (B, S, N, H * D), contiguous,
    in `compute_dtype`.

    weights: (B, H, N, N); values, gate: (B, S, N, H * D) with the channel axis contiguous (other
    strides free; copied otherwise, or when not in the compute dtype). D a power of two >= 16. CPU
    tensors run Triton's interpreter.
    """
    batch, heads = weights.shape[:2]
    _, msa_rows, tokens, width = values.shape
    weights = weights if weights.dtype == compute_dtype and weights.stride(-1) == 1 else weights.to(compute_dtype).contiguous()
    values, gate = (t if t.dtype == compute_dtype and t.stride(-1) == 1 else t.to(compute_dtype).contiguous() for t in (values, gate))
    out = torch.empty(batch, msa_rows, tokens, width, device=values.device, dtype=compute_dtype)
    if out.numel() == 0:
        return out
    config = config or CONFIGS[0]
    grid = (triton.cdiv(tokens, config.block_i) * triton.cdiv(msa_rows, config.block_s), batch * heads)
    _pair_average_kernel[grid](
        weights,
        values,
        gate,
        out,
        msa_rows,
        tokens,
        weights.stride(0),
        weights.stride(1),
        weights.stride(2),
        values.stride(0),
        values.stride(1),
        values.stride(2),
        gate.stride(0),
        gate.stride(1),
        gate.stride(2),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        HEADS=heads,
        D=width // heads,
        BLOCK_I=config.block_i,
        BLOCK_S=config.block_s,
        BLOCK_J=config.block_j,
        **dot_flags(values.device, compute_dtype),
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    return out
