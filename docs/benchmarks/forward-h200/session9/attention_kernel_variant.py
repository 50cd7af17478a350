"""Session 9 device benchmark: a copy of the shipped flash triangle-attention kernel with switches.

TWO_ROWS (rows per program: 2 as shipped, or 1), CLAMP_P (the clamp of p's exponent), MMAV2 (compiled
with DISABLE_MMA_V3=1: mma.sync instead of wgmma). The launcher adds maxnreg. Original docstring:


Flash attention with the triangle bias. One program takes BLOCK_M queries of one (batch, head)
for a pair of rows i (the bias is the same for every row, so each bias tile is loaded and
converted once for both) and walks the keys in BLOCK_N blocks. Per row and key block:

    logits = (scale * q) k^T + bias tile + key bias    fp32: the bias tile is the product's initial
                                                       accumulator, the key bias a broadcast add
    online softmax in fp32 (running max and sum, exp2); acc += p v, p rounded to the compute dtype

Both rows' logits products are issued before either row's softmax, so the tensor cores work on
the second while the ALUs take the first. Measured on the H200 (session 7, `attention_variants.py`),
the broadcast add and this order together were 6.5-7.4% faster at 1,024-2,560 tokens than a rank-1
tensor-core product for the key bias and row-by-row order.

The key bias (0 for valid keys, MASK_LOGIT for masked and padding keys, one row per (batch, row
i)) is built by the launcher, so no per-logit select is needed; keys past the end are masked by
it too (their k, v and bias loads read zeros). The (queries x keys) logits never reach HBM.

Memory traffic: the bias and key-bias tiles of the next key block are prefetched into registers
one step ahead (Triton's pipeliner stages only dot operands loaded from memory, k and v, through
shared memory). Program order (one flat grid) is chosen for L2 reuse: programs are grouped by
head, then by GROUP_QUERIES query positions; within a group the query blocks of one row pair run
together, then the next pair. So a row's keys/values come from HBM once per group (once in all
up to 1,024 tokens) and a group's bias rows (12 MB at 6,000 tokens in bf16) stay in L2 while all
rows pass over them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from foldmill.kernels.triton_dot_operands import dot_operand, rounded

# Query positions whose bias rows one group of programs keeps hot in L2 (see the module docstring).
GROUP_QUERIES = 1024
# Additive logit of masked keys, as in the reference (foldmill.model.layers.triangle_attention).
MASK_LOGIT = -1e9
# Key-bias rows are padded to a multiple of the widest key block, plus one block for the last
# step's prefetch; the padding is masked.
KEY_PADDING = 128
LOG2E = tl.constexpr(1.4426950408889634)


@dataclass(frozen=True)
class BlockConfig:
    """Queries per program, keys per step, warps, software-pipeline stages."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


# sm_90 candidates (Triton 3.6, ptxas for sm_90a), the default first. Head dims 16/32, measured on the
# H200 with the fused gate (1 x N rows x 4 heads x 32): with the broadcast key bias (session 7), 64 x 64
# tiles at 4 warps and 3 stages took 4.29 / 18.9 / 59.2 ms at 1,024 / 1,700 / 2,560 tokens, 128 x 128 at
# 8 warps 6.70 / 37.8 / 101 ms; before it (rank-1 key bias, session 6) 64 x 64 also won, against
# 128 x 128 at 2 and 3 stages and 128 x 64. So one candidate: no autotuning, whose every extra
# candidate costs ~1 s of compilation in each new process (every Slurm job's replica). Head dim 64
# (not a Boltz-2 width): 128 x 128 tiles spill and need 256 KB of shared memory at 3 stages, so only
# the narrower tiles; not re-measured with the broadcast key bias.
NARROW_CONFIGS = (BlockConfig(64, 64, 4, 3),)
WIDE_CONFIGS = (BlockConfig(128, 64, 8, 2), BlockConfig(128, 64, 8, 3), BlockConfig(64, 64, 4, 3))
NARROW_HEAD_DIM = 32


def candidates(head_dim: int) -> tuple[BlockConfig, ...]:
    """The block configurations tried for this head dim, the default first."""
    return NARROW_CONFIGS if head_dim <= NARROW_HEAD_DIM else WIDE_CONFIGS


@triton.jit
def _logits(q, k_row, k_stride_j, key_bias, key, key_ok, dim, bias, DOT_PRECISION: tl.constexpr, EMULATE_BF16: tl.constexpr, PER_ROW_KEY_BIAS: tl.constexpr):
    """One row's logits for one key block: (scale * q) k^T + bias tile + key bias, fp32."""
    k_t = tl.load(k_row + key[None, :] * k_stride_j + dim[:, None], mask=key_ok[None, :], other=0.0)
    logits = tl.dot(q, dot_operand(k_t, EMULATE_BF16), bias, input_precision=DOT_PRECISION)
    if PER_ROW_KEY_BIAS:
        logits = logits + key_bias.to(tl.float32)[None, :]
    return logits


@triton.jit
def _softmax_update(
    logits,
    v_row,
    v_stride_j,
    key,
    key_ok,
    dim,
    running_max,
    running_sum,
    acc,
    DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    EMULATE_BF16: tl.constexpr,
    CLAMP_P: tl.constexpr,
):
    """The online-softmax update of one row by one key block's logits; acc += p v."""
    new_max = tl.maximum(running_max, tl.max(logits, axis=1))
    new_max_log2 = new_max * LOG2E
    # Exponents are <= 0 by construction; the clamp keeps them so when the compiler contracts
    # x * LOG2E - m into an FMA: for a row whose keys are all masked the logits sit near MASK_LOGIT,
    # where that rounding difference reaches +-64 and, compounded over key blocks, overflowed to
    # inf/NaN on the H200 (1,000 tokens, fully masked padding row).
    correction = tl.math.exp2(tl.minimum(running_max * LOG2E - new_max_log2, 0.0))  # 0 at the first block
    if CLAMP_P:
        p = tl.math.exp2(tl.minimum(logits * LOG2E - new_max_log2[:, None], 0.0))
    else:
        p = tl.math.exp2(logits * LOG2E - new_max_log2[:, None])
    running_sum = running_sum * correction + tl.sum(p, axis=1)
    v = tl.load(v_row + key[:, None] * v_stride_j + dim[None, :], mask=key_ok[:, None], other=0.0)
    p = rounded(p, DTYPE, EMULATE_BF16)
    acc = tl.dot(p, dot_operand(v, EMULATE_BF16), acc * correction[:, None], input_precision=DOT_PRECISION)
    return new_max, running_sum, acc


@triton.jit
def _store_row(
    out_tile, gate_tile, acc, running_sum, store_ok, GATED: tl.constexpr, DTYPE: tl.constexpr, EMULATE_BF16: tl.constexpr
):
    """acc / running_sum (>= 1: the largest logit contributes exp2(0)), times sigmoid(gate) when GATED,
    into the row's output tile."""
    out = acc / running_sum[:, None]
    if GATED:
        gate = tl.load(gate_tile, mask=store_ok[:, None], other=0.0).to(tl.float32)
        out = out * tl.sigmoid(gate)
    out = rounded(out, DTYPE, EMULATE_BF16).to(DTYPE)  # 2nd cast: interpreter only
    tl.store(out_tile, out, mask=store_ok[:, None])


@triton.jit(do_not_specialize=["rows", "queries", "keys", "tuning_class"])  # one compilation for all sizes
def _attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    bias_ptr,
    key_bias_ptr,
    gate_ptr,
    out_ptr,
    rows,
    queries,
    keys,
    scale,
    tuning_class,  # read only by the autotuner's key
    q_stride_b,
    q_stride_i,
    q_stride_h,
    q_stride_j,
    k_stride_b,
    k_stride_i,
    k_stride_h,
    k_stride_j,
    v_stride_b,
    v_stride_i,
    v_stride_h,
    v_stride_j,
    bias_stride_b,
    bias_stride_h,
    bias_stride_q,
    key_bias_stride_b,
    key_bias_stride_i,
    gate_stride_b,
    gate_stride_i,
    gate_stride_j,
    out_stride_b,
    out_stride_i,
    out_stride_h,
    out_stride_j,
    HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GROUP_QUERIES: tl.constexpr,
    ALIGN: tl.constexpr,
    GATED: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    EMULATE_BF16: tl.constexpr,
    TWO_ROWS: tl.constexpr = True,
    CLAMP_P: tl.constexpr = True,
    MMAV2: tl.constexpr = False,
    PER_ROW_KEY_BIAS: tl.constexpr = True,  # False: the launcher folded the (row-shared) key bias into the bias  # only keys the compiled kernel: DISABLE_MMA_V3 is set while it compiles
):
    # ALIGN divides both (the launcher makes sure); said this way the compiler vectorises the bias loads.
    keys = (keys // ALIGN) * ALIGN
    bias_stride_q = (bias_stride_q // ALIGN) * ALIGN

    # Program id -> (batch, head, row pair, query block); see the module docstring for the order.
    query_blocks = tl.cdiv(queries, BLOCK_M)
    row_pairs = tl.cdiv(rows, 2) if TWO_ROWS else rows
    group_blocks: tl.constexpr = max(GROUP_QUERIES // BLOCK_M, 1)
    pid = tl.program_id(0)
    per_head = row_pairs * query_blocks
    batch_head = pid // per_head
    in_head = pid % per_head
    first_block = (in_head // (group_blocks * row_pairs)) * group_blocks
    blocks_here = min(query_blocks - first_block, group_blocks)  # the last group may be narrower
    in_group = in_head - first_block * row_pairs
    query_block = first_block + in_group % blocks_here
    row0 = (in_group // blocks_here) * (2 if TWO_ROWS else 1)
    row1 = tl.minimum(row0 + 1, rows - 1)  # an odd last row is computed and stored twice (the same values)
    # 64-bit offsets: row * stride exceeds 2^31 from ~4,000 tokens.
    batch = (batch_head // HEADS).to(tl.int64)
    head = (batch_head % HEADS).to(tl.int64)
    row0 = row0.to(tl.int64)
    row1 = row1.to(tl.int64)

    dtype = out_ptr.dtype.element_ty  # the compute dtype: q, k, v, the p operand and the output
    query = query_block * BLOCK_M + tl.arange(0, BLOCK_M)
    dim = tl.arange(0, HEAD_DIM)
    query_ok = query < queries
    q_head = q_ptr + batch * q_stride_b + head * q_stride_h + query[:, None] * q_stride_j + dim[None, :]
    # scale * q rounded to the compute dtype, as the reference's matmul(q * scale, k^T) does.
    q0 = tl.load(q_head + row0 * q_stride_i, mask=query_ok[:, None], other=0.0)
    q0 = rounded(dot_operand(q0, EMULATE_BF16) * scale, dtype, EMULATE_BF16)
    q1 = tl.load(q_head + row1 * q_stride_i, mask=query_ok[:, None], other=0.0)
    q1 = rounded(dot_operand(q1, EMULATE_BF16) * scale, dtype, EMULATE_BF16)
    k_head = k_ptr + batch * k_stride_b + head * k_stride_h
    v_head = v_ptr + batch * v_stride_b + head * v_stride_h
    key_bias_row0 = key_bias_ptr + batch * key_bias_stride_b + row0 * key_bias_stride_i
    key_bias_row1 = key_bias_ptr + batch * key_bias_stride_b + row1 * key_bias_stride_i
    # Queries past the end read the last query's bias row (in bounds; their output is not stored).
    last_query = tl.minimum(query, queries - 1)
    bias_rows = bias_ptr + batch * bias_stride_b + head * bias_stride_h + last_query[:, None] * bias_stride_q

    max0 = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    sum0 = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc0 = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)
    max1, sum1, acc1 = max0, sum0, acc0
    key = tl.arange(0, BLOCK_N)
    bias = tl.load(bias_rows + key[None, :], mask=(key < keys)[None, :], other=0.0)
    key_bias0 = tl.load(key_bias_row0 + key)  # key-bias rows are padded: always in bounds
    key_bias1 = tl.load(key_bias_row1 + key)
    for start in range(0, keys, BLOCK_N):
        key = start + tl.arange(0, BLOCK_N)
        key_ok = key < keys
        next_key = key + BLOCK_N
        next_bias = tl.load(bias_rows + next_key[None, :], mask=(next_key < keys)[None, :], other=0.0)
        next_key_bias0 = tl.load(key_bias_row0 + next_key)
        next_key_bias1 = tl.load(key_bias_row1 + next_key) if TWO_ROWS else next_key_bias0
        bias_f32 = bias.to(tl.float32)
        k_row0, k_row1 = k_head + row0 * k_stride_i, k_head + row1 * k_stride_i
        logits0 = _logits(q0, k_row0, k_stride_j, key_bias0, key, key_ok, dim, bias_f32, DOT_PRECISION, EMULATE_BF16, PER_ROW_KEY_BIAS)
        if TWO_ROWS:
          logits1 = _logits(q1, k_row1, k_stride_j, key_bias1, key, key_ok, dim, bias_f32, DOT_PRECISION, EMULATE_BF16, PER_ROW_KEY_BIAS)
        v_row0, v_row1 = v_head + row0 * v_stride_i, v_head + row1 * v_stride_i
        max0, sum0, acc0 = _softmax_update(
            logits0, v_row0, v_stride_j, key, key_ok, dim, max0, sum0, acc0, dtype, DOT_PRECISION, EMULATE_BF16, CLAMP_P
        )
        if TWO_ROWS:
            max1, sum1, acc1 = _softmax_update(
                logits1, v_row1, v_stride_j, key, key_ok, dim, max1, sum1, acc1, dtype, DOT_PRECISION, EMULATE_BF16, CLAMP_P
            )
        bias = next_bias
        key_bias0 = next_key_bias0
        key_bias1 = next_key_bias1

    # out[b, i, h, j, d] at the given strides (d contiguous); the gate in (B, I, Jq, H * D) (d contiguous).
    out_head = out_ptr + batch * out_stride_b + head * out_stride_h + query[:, None] * out_stride_j + dim[None, :]
    gate_head = gate_ptr + batch * gate_stride_b + head * HEAD_DIM + query[:, None] * gate_stride_j + dim[None, :]
    _store_row(
        out_head + row0 * out_stride_i, gate_head + row0 * gate_stride_i, acc0, sum0, query_ok, GATED, dtype, EMULATE_BF16
    )
    if TWO_ROWS:
      _store_row(
        out_head + row1 * out_stride_i, gate_head + row1 * gate_stride_i, acc1, sum1, query_ok, GATED, dtype, EMULATE_BF16
    )



def _key_bias(mask, batch, rows, keys, dtype, mask_logit):
    padded = (triton.cdiv(keys, KEY_PADDING) + 1) * KEY_PADDING
    out = torch.full((batch, rows, padded), max(mask_logit, torch.finfo(dtype).min), device=mask.device, dtype=dtype)
    valid = mask.expand(batch, rows, 1, 1, keys)[:, :, 0, 0, :]
    out[:, :, :keys].masked_fill_(valid, 0.0)
    return out


def launch(q, k, v, bias, mask, scale, gate, block_m, block_n, warps, stages, two_rows=True, clamp=True, maxnreg=None,
           mmav2=False, group_queries=GROUP_QUERIES, mask_logit=MASK_LOGIT, fold_key_bias=False, bias_fp32=False):
    """The gated kernel on model-layout inputs (bias key-contiguous in bf16), one variant."""
    import os

    batch, rows, heads, queries, head_dim = q.shape
    keys = k.shape[-2]
    if fold_key_bias:  # rows share one key mask (a token-mask outer product): fold it into the bias, once
        key_valid = mask.reshape(mask.shape[0], -1, keys).any(1)  # (B, keys)
        bias = bias + torch.where(key_valid, 0.0, mask_logit).to(bias.dtype)[:, None, None, None, :]
    if bias_fp32:
        bias = bias.float()
    bias = bias.expand(batch, 1, heads, queries, keys)
    out = torch.empty(batch, rows, queries, heads * head_dim, device=q.device, dtype=q.dtype)
    out_strides = (out.stride(0), out.stride(1), head_dim, out.stride(2))
    key_biases = _key_bias(mask, batch, rows, keys, q.dtype, mask_logit)
    args = (q, k, v, bias, key_biases, gate, out, rows, queries, keys, scale, triton.next_power_of_2(keys))
    strides = (*q.stride()[:4], *k.stride()[:4], *v.stride()[:4], bias.stride(0), *bias.stride()[2:4])
    strides += (*key_biases.stride()[:2], *gate.stride()[:3], *out_strides)
    programs = batch * heads * (triton.cdiv(rows, 2) if two_rows else rows)
    options = {"maxnreg": maxnreg} if maxnreg else {}
    if mmav2:
        os.environ["DISABLE_MMA_V3"] = "1"
    try:
        _attention_kernel[(programs * triton.cdiv(queries, block_m),)](
            *args, *strides, HEADS=heads, HEAD_DIM=head_dim, GROUP_QUERIES=group_queries,
            ALIGN=math.gcd(16, keys, *bias.stride()[:-1]), GATED=True, DOT_PRECISION="tf32", EMULATE_BF16=False,
            TWO_ROWS=two_rows, CLAMP_P=clamp, MMAV2=mmav2, PER_ROW_KEY_BIAS=not fold_key_bias, BLOCK_M=block_m, BLOCK_N=block_n,
            num_warps=warps, num_stages=stages, **options,
        )
    finally:
        os.environ.pop("DISABLE_MMA_V3", None)
    return out
