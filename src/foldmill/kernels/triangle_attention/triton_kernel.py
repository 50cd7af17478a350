"""The Triton kernel behind foldmill.kernels.triangle_attention.triton (imports triton: load it lazily).

Flash attention with the triangle bias. One program takes BLOCK_M queries of one (batch, head)
for a pair of rows i (the bias is the same for every row, so each bias tile is loaded and
converted once for both) and walks the keys in BLOCK_N blocks. Per row and key block:

    logits = (scale * q) k^T + bias tile [+ key bias]    fp32: the bias tile is the product's
                                                         initial accumulator
    online softmax in fp32 (running max and sum, exp2); acc += p v, p rounded to the compute dtype

Masks: the launcher folds the key mask the rows share (their union: for a pair mask made from a
token mask, the valid tokens) into its one key-contiguous copy of the bias (MASK_LOGIT where masked).
A row pair whose masks both equal it (every row of a token-mask outer product but the padding rows)
runs the loop without any key bias: 22% fewer instructions per key block, and 7% / 11% / 14% faster
at 1,024 / 1,700 / 2,472 tokens on the H200. Any other row pair (a padding
row, or masks that differ from row to row) adds its rows' own key biases (0 or MASK_LOGIT, built by
the launcher) as a broadcast add, and gets the reference's result either way: its masked keys are
at least MASK_LOGIT down. Keys past the end read MASK_LOGIT as bias (their k and v read zeros).
The (queries x keys) logits never reach HBM.

Both rows' logits products are issued before either row's softmax, so the tensor cores work on
the second while the ALUs take the first (6.5-7.4% faster than row by row).

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
from foldmill.kernels.triton_support import dot_flags

# Query positions whose bias rows one group of programs keeps hot in L2 (see the module docstring).
GROUP_QUERIES = 1024
# Additive logit of masked keys, as in the reference (foldmill.model.layers.triangle_attention).
MASK_LOGIT = -1e9
# Key-bias and folded-bias rows are padded to a multiple of the widest key block, plus one block for
# the last step's prefetch; the padding is masked.
KEY_PADDING = 128
LOG2E = tl.constexpr(1.4426950408889634)


@dataclass(frozen=True)
class BlockConfig:
    """Queries per program, keys per step, warps, software-pipeline stages, and a cap on registers
    per thread (None: the compiler's choice), which sets how many programs share an SM."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    max_registers: int | None = None


# sm_90 candidates (Triton 3.6, ptxas for sm_90a), the default first. Head dims 16/32, measured on the
# H200 with the fused gate (1 x N rows x 4 heads x 32, the model's masks): 64 x 32 tiles at 4 warps,
# 3 stages and 128 registers (four programs per SM instead of two) take 0.76 / 3.77 / 15.8 / 44.5 ms at
# 512 / 1,024 / 1,700 / 2,472 tokens, against 0.72 / 4.52 / 19.1 / 55.2 for 64 x 64 tiles (228 registers)
# without the folded key mask. 64 x 64 tiles in this two-loop kernel take 49.6 ms at 2,472 uncapped, 62-84 capped at 168 or
# 128 registers. Without the fold, 128 x 64 or 128 x 32 tiles at 8 warps, mma.sync instead of wgmma, 2 or
# 4 stages, one row per program and 64 x 128 tiles all lost or tied at 1,700 and 2,472 tokens.
# So one candidate: no autotuning, whose every extra candidate costs ~1 s of compilation in each new
# process (every Slurm job's replica). Head dim 64 (not a Boltz-2 width): 128 x 128 tiles spill and
# need 256 KB of shared memory at 3 stages, so only the narrower tiles.
NARROW_CONFIGS = (BlockConfig(64, 32, 4, 3, max_registers=128),)
WIDE_CONFIGS = (BlockConfig(128, 64, 8, 2), BlockConfig(128, 64, 8, 3), BlockConfig(64, 64, 4, 3))
NARROW_HEAD_DIM = 32


def candidates(head_dim: int) -> tuple[BlockConfig, ...]:
    """The block configurations tried for this head dim, the default first."""
    return NARROW_CONFIGS if head_dim <= NARROW_HEAD_DIM else WIDE_CONFIGS


@triton.jit
def _logits(
    q, k_row, k_stride_j, key_bias, key, key_ok, dim, bias, PER_ROW_KEY_BIAS: tl.constexpr, DOT_PRECISION: tl.constexpr,
    EMULATE_BF16: tl.constexpr,
):  # fmt: skip
    """One row's logits for one key block: (scale * q) k^T + bias tile (+ the row's key bias), fp32."""
    k_t = tl.load(k_row + key[None, :] * k_stride_j + dim[:, None], mask=key_ok[None, :], other=0.0)
    logits = tl.dot(q, dot_operand(k_t, EMULATE_BF16), bias, input_precision=DOT_PRECISION)
    if PER_ROW_KEY_BIAS:
        logits += key_bias.to(tl.float32)[None, :]
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
    CLAMP_P: tl.constexpr,
    DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    EMULATE_BF16: tl.constexpr,
):
    """The online-softmax update of one row by one key block's logits; acc += p v."""
    new_max = tl.maximum(running_max, tl.max(logits, axis=1))
    new_max_log2 = new_max * LOG2E
    # The compiler contracts x * LOG2E - m into an FMA, so an exponent can round above 0. For a row
    # whose keys are all masked the logits sit near MASK_LOGIT (twice it on the per-row path, where
    # the folded bias adds its own), where that reaches +64 (+128): unclamped, p and the correction
    # overflowed to inf/NaN on the H200 (1,000 tokens, fully masked padding row). The correction is
    # always clamped, which keeps p's rounding from compounding over key blocks; p itself only on the
    # per-row path (p <= 2^64 is finite, 2^128 is not). Clamping p on the folded path too cost 1-4%.
    correction = tl.math.exp2(tl.minimum(running_max * LOG2E - new_max_log2, 0.0))  # 0 at the first block
    p = logits * LOG2E - new_max_log2[:, None]
    if CLAMP_P:
        p = tl.minimum(p, 0.0)
    p = tl.math.exp2(p)
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


@triton.jit
def _attend_row_pair(
    q0, q1, k_head, k_stride_i, k_stride_j, v_head, v_stride_i, v_stride_j, row0, row1, bias_rows, key_bias_row0,
    key_bias_row1, keys, dim, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
    PER_ROW_KEY_BIAS: tl.constexpr, DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr, EMULATE_BF16: tl.constexpr,
):  # fmt: skip
    """Both rows' unnormalised outputs and softmax sums over every key block."""
    max0 = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    sum0 = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc0 = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)
    max1, sum1, acc1 = max0, sum0, acc0
    key = tl.arange(0, BLOCK_N)
    # Keys past the end read the folded bias's padding, MASK_LOGIT (no key bias masks them on the folded
    # path); the padding covers the last block and the prefetch past it, so no bias load is masked.
    bias = tl.load(bias_rows + key[None, :])
    key_bias0 = tl.load(key_bias_row0 + key)  # key-bias rows are padded: always in bounds
    key_bias1 = tl.load(key_bias_row1 + key)
    for start in range(0, keys, BLOCK_N):
        key = start + tl.arange(0, BLOCK_N)
        key_ok = key < keys
        next_key = key + BLOCK_N
        next_bias = tl.load(bias_rows + next_key[None, :])
        next_key_bias0 = key_bias0
        next_key_bias1 = key_bias1
        if PER_ROW_KEY_BIAS:
            next_key_bias0 = tl.load(key_bias_row0 + next_key)
            next_key_bias1 = tl.load(key_bias_row1 + next_key)
        bias_f32 = bias.to(tl.float32)
        k_row0, k_row1 = k_head + row0 * k_stride_i, k_head + row1 * k_stride_i
        logits0 = _logits(
            q0, k_row0, k_stride_j, key_bias0, key, key_ok, dim, bias_f32, PER_ROW_KEY_BIAS, DOT_PRECISION, EMULATE_BF16
        )
        logits1 = _logits(
            q1, k_row1, k_stride_j, key_bias1, key, key_ok, dim, bias_f32, PER_ROW_KEY_BIAS, DOT_PRECISION, EMULATE_BF16
        )
        v_row0, v_row1 = v_head + row0 * v_stride_i, v_head + row1 * v_stride_i
        max0, sum0, acc0 = _softmax_update(
            logits0, v_row0, v_stride_j, key, key_ok, dim, max0, sum0, acc0, PER_ROW_KEY_BIAS, DTYPE, DOT_PRECISION,
            EMULATE_BF16,
        )  # fmt: skip
        max1, sum1, acc1 = _softmax_update(
            logits1, v_row1, v_stride_j, key, key_ok, dim, max1, sum1, acc1, PER_ROW_KEY_BIAS, DTYPE, DOT_PRECISION,
            EMULATE_BF16,
        )  # fmt: skip
        bias = next_bias
        key_bias0 = next_key_bias0
        key_bias1 = next_key_bias1
    return acc0, sum0, acc1, sum1


@triton.jit(do_not_specialize=["rows", "queries", "keys", "tuning_class"])  # one compilation for all sizes
def _attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    bias_ptr,
    key_bias_ptr,
    conform_ptr,
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
    conform_stride_b,
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
):
    # ALIGN divides both (the launcher makes sure); said this way the compiler vectorises the bias loads.
    keys = (keys // ALIGN) * ALIGN
    bias_stride_q = (bias_stride_q // ALIGN) * ALIGN

    # Program id -> (batch, head, row pair, query block); see the module docstring for the order.
    query_blocks = tl.cdiv(queries, BLOCK_M)
    row_pairs = tl.cdiv(rows, 2)
    group_blocks: tl.constexpr = max(GROUP_QUERIES // BLOCK_M, 1)
    pid = tl.program_id(0)
    per_head = row_pairs * query_blocks
    batch_head = pid // per_head
    in_head = pid % per_head
    first_block = (in_head // (group_blocks * row_pairs)) * group_blocks
    blocks_here = min(query_blocks - first_block, group_blocks)  # the last group may be narrower
    in_group = in_head - first_block * row_pairs
    query_block = first_block + in_group % blocks_here
    row0 = (in_group // blocks_here) * 2
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
    # Queries past the end read the last query's bias row (in bounds; their output is not stored).
    last_query = tl.minimum(query, queries - 1)
    bias_rows = bias_ptr + batch * bias_stride_b + head * bias_stride_h + last_query[:, None] * bias_stride_q

    # Rows whose key mask is the one folded into the bias take the loop without key biases.
    conform_rows = conform_ptr + batch * conform_stride_b
    folded = (tl.load(conform_rows + row0) != 0) & (tl.load(conform_rows + row1) != 0)
    key_bias_row0 = key_bias_ptr + batch * key_bias_stride_b + row0 * key_bias_stride_i
    key_bias_row1 = key_bias_ptr + batch * key_bias_stride_b + row1 * key_bias_stride_i
    if folded:
        acc0, sum0, acc1, sum1 = _attend_row_pair(
            q0, q1, k_head, k_stride_i, k_stride_j, v_head, v_stride_i, v_stride_j, row0, row1, bias_rows,
            key_bias_row0, key_bias_row1, keys, dim, BLOCK_M, BLOCK_N, HEAD_DIM, False, dtype, DOT_PRECISION,
            EMULATE_BF16,
        )  # fmt: skip
    else:
        acc0, sum0, acc1, sum1 = _attend_row_pair(
            q0, q1, k_head, k_stride_i, k_stride_j, v_head, v_stride_i, v_stride_j, row0, row1, bias_rows,
            key_bias_row0, key_bias_row1, keys, dim, BLOCK_M, BLOCK_N, HEAD_DIM, True, dtype, DOT_PRECISION,
            EMULATE_BF16,
        )  # fmt: skip

    # out[b, i, h, j, d] at the given strides (d contiguous); the gate in (B, I, Jq, H * D) (d contiguous).
    out_head = out_ptr + batch * out_stride_b + head * out_stride_h + query[:, None] * out_stride_j + dim[None, :]
    gate_head = gate_ptr + batch * gate_stride_b + head * HEAD_DIM + query[:, None] * gate_stride_j + dim[None, :]
    _store_row(
        out_head + row0 * out_stride_i, gate_head + row0 * gate_stride_i, acc0, sum0, query_ok, GATED, dtype, EMULATE_BF16
    )
    _store_row(
        out_head + row1 * out_stride_i, gate_head + row1 * gate_stride_i, acc1, sum1, query_ok, GATED, dtype, EMULATE_BF16
    )


def _prune(configs: list[triton.Config], named_args: dict, **kwargs: object) -> list[triton.Config]:
    """Keep the candidates meant for this head dim."""
    wanted = {
        (c.block_m, c.block_n, c.num_warps, c.num_stages, c.max_registers) for c in candidates(kwargs["HEAD_DIM"])
    }
    return [
        c for c in configs if (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages, c.maxnreg) in wanted
    ]


# Tuned once per process and (head dim, size class of the key count, dtypes, alignment) at its first
# call: that call must be eager, never inside CUDA-graph capture (benchmarking launches and
# synchronises). The size class (next power of two of the keys) keeps one tuning per class of lengths.
# The winners are kept in Triton's on-disk cache (keyed by GPU target, kernel source and key), so a
# new process, say the next Slurm job's replica, reuses them instead of benchmarking again.
_autotuned_kernel = triton.autotune(
    configs=[
        triton.Config(
            {"BLOCK_M": c.block_m, "BLOCK_N": c.block_n},
            num_warps=c.num_warps,
            num_stages=c.num_stages,
            maxnreg=c.max_registers,
        )
        for c in dict.fromkeys(NARROW_CONFIGS + WIDE_CONFIGS)
    ],
    key=["HEAD_DIM", "tuning_class", "ALIGN", "GATED"],
    prune_configs_by={"early_config_prune": _prune},
    cache_results=True,
)(_attention_kernel)


def _mask_logit(dtype: torch.dtype) -> float:
    """MASK_LOGIT, or in fp16, whose range ends at 65504, its lowest value (exp -> 0 beside any valid key, finite)."""
    return max(MASK_LOGIT, torch.finfo(dtype).min)


def _padded_keys(keys: int) -> int:
    """Key rows padded to a multiple of KEY_PADDING plus one KEY_PADDING (the kernel prefetches one key
    block past the last)."""
    return (triton.cdiv(keys, KEY_PADDING) + 1) * KEY_PADDING


def _shared_key_bias(mask: Tensor, batch: int, rows: int, keys: int, dtype: torch.dtype) -> Tensor:
    """The key mask the rows share as a key bias (B, keys): 0 where any row's key is valid (the union of
    the rows' masks; for a pair mask made from a token mask, the valid tokens), _mask_logit elsewhere.

    mask: (B or 1, I or 1, 1, 1, keys), nonzero = valid."""
    valid = _valid(mask, batch, rows, keys)
    return torch.zeros(batch, keys, device=mask.device, dtype=dtype).masked_fill_(~valid.any(1), _mask_logit(dtype))


def _row_masks(mask: Tensor, shared_key_bias: Tensor, rows: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """(per-row key biases (B, I, padded keys), conforming rows (B, I) int8): a row conforms when its mask
    is the one folded into the bias (shared_key_bias's valid keys), which every row of a token-mask outer
    product but the padding rows does. Key biases are 0 for valid keys and _mask_logit for masked ones,
    padded (_padded_keys)."""
    batch, keys = shared_key_bias.shape
    valid = _valid(mask, batch, rows, keys)
    conforming = (valid == (shared_key_bias == 0)[:, None, :]).all(-1).to(torch.int8)
    per_row = torch.full((batch, rows, _padded_keys(keys)), _mask_logit(dtype), device=mask.device, dtype=dtype)
    per_row[:, :, :keys].masked_fill_(valid, 0.0)
    return per_row, conforming


def _valid(mask: Tensor, batch: int, rows: int, keys: int) -> Tensor:
    """The mask as (B, I, keys) bool."""
    valid = mask.expand(batch, rows, 1, 1, keys)[:, :, 0, 0, :]
    return valid if valid.dtype == torch.bool else valid != 0


def _prepared_bias(
    bias: Tensor, mask: Tensor, batch: int, rows: int, compute_dtype: torch.dtype, prepared: dict | None
) -> tuple[Tensor, Tensor]:
    """(the shared key bias, the folded bias), made once per bias when the caller keeps `prepared` for the
    calls on one bias (TriangleAttention's row blocks: at 2,472 tokens twelve folds of 49 MB per module,
    1.8 ms per pairformer block). The first call's rows set the shared mask; later blocks'
    rows conform to it or take the per-row loop, so the result is the same either way. The bias is known by
    its storage and shape (a module call does not write it between its blocks; inference tensors carry no
    version counter to tell)."""
    source = (bias.data_ptr(), tuple(bias.shape), compute_dtype)
    if prepared is not None and prepared.get("source") == source:
        return prepared["shared_key_bias"], prepared["folded_bias"]
    shared_key_bias = _shared_key_bias(mask, batch, rows, mask.shape[-1], compute_dtype)
    folded = _folded_bias(bias, shared_key_bias, compute_dtype)
    if prepared is not None:
        prepared.update(source=source, shared_key_bias=shared_key_bias, folded_bias=folded)
    return shared_key_bias, folded


def _folded_bias(bias: Tensor, shared_key_bias: Tensor, compute_dtype: torch.dtype) -> Tensor:
    """bias (B or 1, 1, H, Jq, Jk) + the shared key bias (B, Jk): (B, 1, H, Jq, padded Jk), key-contiguous,
    the bias read once; the keys past Jk (_padded_keys) hold the masked logit. A key-contiguous
    bias keeps its dtype; another is read in the compute dtype (fp32 for fp32 compute)."""
    batch, keys = shared_key_bias.shape
    dtype = bias.dtype if bias.stride(-1) == 1 or compute_dtype == torch.float32 else compute_dtype
    folded = torch.empty(batch, *bias.shape[1:-1], _padded_keys(keys), device=bias.device, dtype=dtype)
    folded[..., keys:] = _mask_logit(dtype)
    torch.add(bias, shared_key_bias.to(dtype).view(batch, 1, 1, 1, keys), out=folded[..., :keys])
    return folded


def flash_triangle_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor,
    mask: Tensor,
    scale: float,
    compute_dtype: torch.dtype,
    config: BlockConfig | None = None,
    group_queries: int = GROUP_QUERIES,
    gate: Tensor | None = None,
    prepared: dict | None = None,
) -> Tensor:
    """softmax(scale * q k^T + bias + mask) v per (batch, row, head); returns (B, I, H, Jq, D) in
    `compute_dtype`, contiguous. With `gate` (B, I, Jq, H * D), any strides but the last: that output
    times sigmoid(gate), in the gate's layout (B, I, Jq, H * D), contiguous (the layout of
    GatedAttention's output projection; no separate sigmoid, multiply and transpose passes).

    q: (B, I, H, Jq, D); k, v: (B, I, H, Jk, D), any strides (read in place; copied only if their
    last axis is strided or their dtype is not the compute dtype); bias: (B or 1, 1, H, Jq, Jk), read
    from one key-contiguous copy with the rows' shared key mask folded in (in the compute dtype unless
    it already was key-contiguous); mask: (B or 1, I or 1, 1, 1, Jk), True (nonzero) = valid key.
    `prepared`: a dict the caller keeps across calls on one bias (row blocks of one pair), holding the
    folded bias made at the first (see _prepared_bias). D must be a power of two >= 16. `config` pins the
    block sizes (else autotuned on CUDA; CPU tensors run the interpreter with the first candidate);
    `group_queries` is the L2 grouping (tests shrink it to exercise partial groups). fp32 compute runs
    exact fp32 dots ("ieee").
    """
    batch, rows, heads, queries, head_dim = q.shape
    keys = k.shape[-2]
    q, k, v = (
        t if t.dtype == compute_dtype and t.stride(-1) == 1 else t.to(compute_dtype).contiguous() for t in (q, k, v)
    )
    if gate is None:
        out = torch.empty(batch, rows, heads, queries, head_dim, device=q.device, dtype=compute_dtype)
        out_strides = out.stride()[:4]
    else:
        if gate.stride(-1) != 1:
            gate = gate.contiguous()
        out = torch.empty(batch, rows, queries, heads * head_dim, device=q.device, dtype=compute_dtype)
        out_strides = (out.stride(0), out.stride(1), head_dim, out.stride(2))  # (b, i, h, j)
    if out.numel() == 0:
        return out
    shared_key_bias, bias = _prepared_bias(bias, mask, batch, rows, compute_dtype, prepared)
    key_biases, conforming = _row_masks(mask, shared_key_bias, rows, compute_dtype)
    on_cpu = q.device.type == "cpu"  # CPU tensors only run under Triton's interpreter
    gate_arg = out if gate is None else gate  # never read without GATED
    args = (q, k, v, bias, key_biases, conforming, gate_arg, out, rows, queries, keys, scale)
    args += (triton.next_power_of_2(keys),)
    strides = (*q.stride()[:4], *k.stride()[:4], *v.stride()[:4], bias.stride(0), *bias.stride()[2:4])
    strides += (*key_biases.stride()[:2], conforming.stride(0), *gate_arg.stride()[:3], *out_strides)
    shape_args = {
        "HEADS": heads,
        "HEAD_DIM": head_dim,
        "GROUP_QUERIES": group_queries,
        "ALIGN": math.gcd(16, keys, *bias.stride()[:-1]),  # see the kernel's first lines
        "GATED": gate is not None,
        **dot_flags(q.device, compute_dtype),
    }
    if config is None and on_cpu:  # no benchmarking in the interpreter
        config = candidates(head_dim)[0]
    programs = batch * heads * triton.cdiv(rows, 2)
    if config is None:
        grid = lambda meta: (programs * triton.cdiv(queries, meta["BLOCK_M"]),)  # noqa: E731
        _autotuned_kernel[grid](*args, *strides, **shape_args)
    else:
        _attention_kernel[(programs * triton.cdiv(queries, config.block_m),)](
            *args,
            *strides,
            **shape_args,
            BLOCK_M=config.block_m,
            BLOCK_N=config.block_n,
            num_warps=config.num_warps,
            num_stages=config.num_stages,
            **({"maxnreg": config.max_registers} if config.max_registers else {}),
        )
    return out
