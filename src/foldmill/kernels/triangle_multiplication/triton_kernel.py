"""The Triton kernels behind foldmill.kernels.triangle_multiplication.triton (imports triton: load it lazily).

The update takes three launches, the cubic edge product in the middle on cuBLAS:

1. `_gated_edges_kernel`: a program takes BLOCK_P pairs (i, k) of one row i of x (of x's transpose for
   incoming edges). It normalises them (fp32 statistics), projects them with p_in and g_in (fp32
   accumulation), gates and masks them, and stores a and b channel-major: a_t[b, c, i, k] = a[b, i, k, c].
   For each channel the edge product is then one matrix product.
2. `torch.bmm` over the B * C channels: a_t[c] @ b_t[c]^T, compute-dtype operands, fp32 accumulation,
   compute-dtype result.
3. `_gated_output_kernel`: a program takes BLOCK_P pairs (i, j) of one row i: the product's channels (read
   channel-major) normalised with norm_out and projected with p_out, times the gate sigmoid(g_out(norm_in(x)))
   made from x again; optionally added to x (the residual), in the output's dtype.

Roundings follow the reference under bf16 autocast (foldmill.model.layers.triangle_multiplication): every
LayerNorm output, projection, sigmoid and product is rounded to the compute dtype where the reference's is.
HBM traffic: x read twice, a_t, b_t and the product written and read once each in the compute dtype, the
output written once. No (N, N, 4C) projection is stored, and no permuting copy is made.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from foldmill.kernels.layer_norm.triton_kernel import affine_layer_norm
from foldmill.kernels.triton_dot_operands import dot_operand, rounded
from foldmill.kernels.triton_support import dot_flags


@dataclass(frozen=True)
class BlockConfig:
    """Pairs per program, warps, software-pipeline stages, a cap on registers per thread (None: the
    compiler's choice), which sets how many programs share an SM, and the persistent programs launched
    per SM (more than fit at once run in later waves, on equal shares of the tiles)."""

    block_p: int
    num_warps: int
    num_stages: int = 2
    max_registers: int | None = None
    programs_per_sm: int = 4


# Pinned on the H200 at 2,472 tokens:
# the edges kernel took 3.99 ms at 64 pairs x 8 warps x 3 stages (4.67 at 2 stages, 6.7-7.8 at 32 x 4), the
# output kernel 5.60 ms at 32 x 4 x 1 (6.2-6.5 at 64 x 8); 64 x 4 and 128 x 8 were slower or ran out of
# shared memory. No autotuning: each candidate cost a compilation in every new process (~20 s of a cold
# run's first target for four). The weights stay in shared memory (the edges kernel's four 128 x 128
# tiles: 128 KB, one program per SM). The output kernel takes 194 registers uncapped, so two programs
# fit on an SM; capped at 168, three do: 4.59 ms against 5.59 at 2,472 tokens, 2.28 against 2.69 at
# 1,704, the same values bit for bit.
# Launching four per SM then (a partial second wave) took 5.91 ms; capped at 128 (four fit), 6.59.
EDGES_CONFIG = BlockConfig(64, 8, 3)
OUTPUT_CONFIG = BlockConfig(32, 4, 1, max_registers=168, programs_per_sm=3)


@triton.jit
def _normed_tile(
    tile, ok, col, eps, weight_ptr, bias_ptr, C: tl.constexpr, DTYPE: tl.constexpr, EMULATE_BF16: tl.constexpr
):  # fmt: skip
    """A (pairs, C) tile loaded as fp32 (rows past the end: zeros), and its LayerNorm rounded to the compute
    dtype (the reference's autocast linears read it so)."""
    x = tl.load(tile, mask=ok[:, None], other=0.0).to(tl.float32)
    return x, rounded(affine_layer_norm(x, col, eps, weight_ptr, bias_ptr, C), DTYPE, EMULATE_BF16)


@triton.jit
def _rounded_f32(x, DTYPE: tl.constexpr, EMULATE_BF16: tl.constexpr):
    """x rounded to the compute dtype, as fp32 for the arithmetic that follows."""
    return rounded(x, DTYPE, EMULATE_BF16).to(tl.float32)


@triton.jit
def _gated(projection, gate_logits, DTYPE: tl.constexpr, EMULATE_BF16: tl.constexpr):
    """round(round(projection) * round(sigmoid(round(gate_logits)))), as the reference's bf16 ops round."""
    projection = _rounded_f32(projection, DTYPE, EMULATE_BF16)
    gate = _rounded_f32(tl.sigmoid(_rounded_f32(gate_logits, DTYPE, EMULATE_BF16)), DTYPE, EMULATE_BF16)
    return _rounded_f32(projection * gate, DTYPE, EMULATE_BF16)


@triton.jit
def _store_edges(
    normed, mask, p_t, g_t, out_tile, k_ok, DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr, EMULATE_BF16: tl.constexpr
):
    """One half of the gated, masked edges (projections p_t, gate g_t: (C, C) dot operands) into its tile."""
    edges = _gated(
        tl.dot(normed, dot_operand(p_t, EMULATE_BF16), input_precision=DOT_PRECISION),
        tl.dot(normed, dot_operand(g_t, EMULATE_BF16), input_precision=DOT_PRECISION),
        DTYPE,
        EMULATE_BF16,
    )
    edges = rounded(edges * mask[:, None], DTYPE, EMULATE_BF16).to(DTYPE)  # 2nd cast: interpreter only
    tl.store(out_tile, edges, mask=k_ok[:, None])


@triton.jit
def _pair_tile(tile, tokens, BLOCK_P: tl.constexpr):
    """Tile number -> (batch, row i, BLOCK_P consecutive pairs of that row, which are in bounds)."""
    blocks = tl.cdiv(tokens, BLOCK_P)
    row = tile // blocks
    pairs = (tile % blocks) * BLOCK_P + tl.arange(0, BLOCK_P)
    return (row // tokens).to(tl.int64), (row % tokens).to(tl.int64), pairs, pairs < tokens


@triton.jit
def _weight_t(weight_ptr, first_row, col, C: tl.constexpr):
    """W[first_row : first_row + C]^T of a row-major (rows, C) weight, a (C, C) dot operand."""
    return tl.load(weight_ptr + (first_row + col[None, :]) * C + col[:, None])


# Both kernels are persistent: a program loads its weights once and walks tiles tile, tile + programs, ...
# With a program per tile, each re-read its weights from L2 (128 KB per 64 pairs for the edges): on the
# H200 at 2,472 tokens the edges kernel took 6.5 ms that way, 4.8 ms persistent.
@triton.jit(do_not_specialize=["tokens", "batch"])  # one compilation for all sizes
def _gated_edges_kernel(
    x_ptr,
    mask_ptr,
    norm_weight_ptr,
    norm_bias_ptr,
    p_ptr,
    g_ptr,
    a_ptr,
    b_ptr,
    tokens,
    batch,
    x_stride_b,
    x_stride_i,
    x_stride_k,
    mask_stride_b,
    mask_stride_i,
    mask_stride_k,
    eps,
    C: tl.constexpr,
    BLOCK_P: tl.constexpr,
    ALIGN: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    EMULATE_BF16: tl.constexpr,
):
    tokens = (tokens // ALIGN) * ALIGN  # see _aligned
    col = tl.arange(0, C)
    dtype = a_ptr.dtype.element_ty  # the compute dtype
    # a from the weights' first C rows, b from the next C.
    p_a, g_a = _weight_t(p_ptr, 0, col, C), _weight_t(g_ptr, 0, col, C)
    p_b, g_b = _weight_t(p_ptr, C, col, C), _weight_t(g_ptr, C, col, C)
    plane = tokens.to(tl.int64) * tokens
    tiles = batch * tokens * tl.cdiv(tokens, BLOCK_P)
    for tile in range(tl.program_id(0), tiles, tl.num_programs(0)):
        b, i, k, k_ok = _pair_tile(tile, tokens, BLOCK_P)
        x_tile = x_ptr + b * x_stride_b + i * x_stride_i + k[:, None] * x_stride_k + col[None, :]
        _, normed = _normed_tile(x_tile, k_ok, col, eps, norm_weight_ptr, norm_bias_ptr, C, dtype, EMULATE_BF16)
        mask_row = mask_ptr + b * mask_stride_b + i * mask_stride_i
        mask = tl.load(mask_row + k * mask_stride_k, mask=k_ok, other=0.0).to(tl.float32)
        # a_t / b_t are (B, C, N, N): for each channel, BLOCK_P consecutive entries of row i.
        out_offsets = (b * C + col[None, :]) * plane + i * tokens + k[:, None]
        _store_edges(normed, mask, p_a, g_a, a_ptr + out_offsets, k_ok, dtype, DOT_PRECISION, EMULATE_BF16)
        _store_edges(normed, mask, p_b, g_b, b_ptr + out_offsets, k_ok, dtype, DOT_PRECISION, EMULATE_BF16)


@triton.jit(do_not_specialize=["tokens", "batch"])
def _gated_output_kernel(
    product_ptr,
    x_ptr,
    out_ptr,
    norm_in_weight_ptr,
    norm_in_bias_ptr,
    norm_out_weight_ptr,
    norm_out_bias_ptr,
    p_ptr,
    g_ptr,
    tokens,
    batch,
    x_stride_b,
    x_stride_i,
    x_stride_j,
    out_stride_b,
    out_stride_i,
    out_stride_j,
    eps,
    C: tl.constexpr,
    BLOCK_P: tl.constexpr,
    RESIDUAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    EMULATE_BF16: tl.constexpr,
):
    col = tl.arange(0, C)
    dtype = product_ptr.dtype.element_ty  # the compute dtype
    p_t, g_t = _weight_t(p_ptr, 0, col, C), _weight_t(g_ptr, 0, col, C)
    plane = tokens.to(tl.int64) * tokens
    tiles = batch * tokens * tl.cdiv(tokens, BLOCK_P)
    for tile in range(tl.program_id(0), tiles, tl.num_programs(0)):
        b, i, j, j_ok = _pair_tile(tile, tokens, BLOCK_P)
        product_tile = product_ptr + (b * C + col[None, :]) * plane + i * tokens + j[:, None]
        _, product = _normed_tile(product_tile, j_ok, col, eps, norm_out_weight_ptr, norm_out_bias_ptr, C, dtype, EMULATE_BF16)
        projection = tl.dot(product, dot_operand(p_t, EMULATE_BF16), input_precision=DOT_PRECISION)

        x_tile = x_ptr + b * x_stride_b + i * x_stride_i + j[:, None] * x_stride_j + col[None, :]
        x, normed_x = _normed_tile(x_tile, j_ok, col, eps, norm_in_weight_ptr, norm_in_bias_ptr, C, dtype, EMULATE_BF16)
        gate_logits = tl.dot(normed_x, dot_operand(g_t, EMULATE_BF16), input_precision=DOT_PRECISION)
        update = _gated(projection, gate_logits, dtype, EMULATE_BF16)
        if RESIDUAL:  # x + update in the output's dtype (x's), the reference's residual add
            update = x + update
        out_tile = out_ptr + b * out_stride_b + i * out_stride_i + j[:, None] * out_stride_j + col[None, :]
        tl.store(out_tile, update.to(out_ptr.dtype.element_ty), mask=j_ok[:, None])


def _aligned(tokens: int) -> int:
    """The edges kernel's ALIGN: the largest of 8, 4, 2, 1 dividing the token count (the model pads it to a
    multiple of 8). The kernel restates the count as a multiple of it, so the compiler knows that a
    channel-major row of a_t / b_t starts on a 16-byte boundary and stores 8 bf16 at a time instead of one
    (the count itself is not specialised on: one compilation for all sizes). On the H200 at 2,472 tokens:
    3.80 ms against 3.98. The same hint in the output kernel (its product loads) made it
    slower, 6.97 ms against 5.66, so that kernel goes without."""
    return math.gcd(8, tokens)


def _launch(kernel: triton.JITFunction, programs: int, config: BlockConfig, *args, **constants) -> None:
    """One persistent launch of `programs` programs at `config`."""
    if config.max_registers is not None:
        constants["maxnreg"] = config.max_registers
    kernel[(programs,)](*args, **constants, BLOCK_P=config.block_p, num_warps=config.num_warps, num_stages=config.num_stages)


def persistent_programs(device: torch.device, batch: int, tokens: int, config: BlockConfig) -> int:
    """Programs per launch: config.programs_per_sm per SM (their weights are loaded once each), at most one
    per row of pairs; under the interpreter (CPU), which runs them one by one, a few."""
    if device.type != "cuda":
        return min(4, batch * tokens)
    return min(torch.cuda.get_device_properties(device).multi_processor_count * config.programs_per_sm, batch * tokens)


def fused_update(
    x: Tensor,
    direction: str,
    mask: Tensor,
    weights: Sequence[Tensor],
    eps: float,
    compute_dtype: torch.dtype,
    residual_out: Tensor | None = None,
    config: BlockConfig | None = None,
) -> Tensor:
    """The triangle multiplicative update of x (B, N, N, C) under pair mask (B, N, N), in `compute_dtype`;
    with `residual_out` (x itself, or a tensor shaped like x), x + update written into it instead.

    `weights`: the reference's eight, in its argument order (norm_in weight and bias, p_in, g_in, norm_out
    weight and bias, p_out, g_out). C must be a power of two from 16 to 128 (the caller checks). `config`
    pins both kernels' block sizes (tests; default: EDGES_CONFIG and OUTPUT_CONFIG).
    """
    norm_in_weight, norm_in_bias, p_in_weight, g_in_weight, norm_out_weight, norm_out_bias, p_out_weight, g_out_weight = weights
    batch, tokens, _, dim = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    p_in, g_in, p_out, g_out = (w.to(compute_dtype).contiguous() for w in (p_in_weight, g_in_weight, p_out_weight, g_out_weight))
    flags = dot_flags(x.device, compute_dtype)
    edges_config, output_config = config or EDGES_CONFIG, config or OUTPUT_CONFIG

    # The edges kernel reads x (and the mask) row by row for outgoing edges, column by column for incoming
    # ones (a column's pairs are 128-channel runs too), so a_t[c, i, k] = a[i, k] or a[k, i]: either way the
    # product is a_t[c] @ b_t[c]^T, whose operands are both contiguous along k (cuBLAS's fastest layout:
    # a_t[c]^T @ b_t[c] on row-major edges ran 1.2x slower at 2,472 tokens).
    edges_x, edges_mask = (x, mask) if direction == "outgoing" else (x.transpose(1, 2), mask.transpose(1, 2))
    a_t = torch.empty((batch, dim, tokens, tokens), device=x.device, dtype=compute_dtype)
    b_t = torch.empty_like(a_t)
    _launch(
        _gated_edges_kernel, persistent_programs(x.device, batch, tokens, edges_config), edges_config,
        edges_x, edges_mask, norm_in_weight, norm_in_bias, p_in, g_in, a_t, b_t, tokens, batch, *edges_x.stride()[:3],
        *edges_mask.stride(), eps, C=dim, ALIGN=_aligned(tokens), **flags,
    )  # fmt: skip
    product = torch.bmm(a_t.view(batch * dim, tokens, tokens), b_t.view(batch * dim, tokens, tokens).mT)
    del a_t, b_t  # freed before the output is allocated

    out = residual_out if residual_out is not None else torch.empty(x.shape, device=x.device, dtype=compute_dtype)
    _launch(
        _gated_output_kernel, persistent_programs(x.device, batch, tokens, output_config), output_config,
        product, x, out, norm_in_weight, norm_in_bias, norm_out_weight, norm_out_bias, p_out, g_out, tokens, batch,
        *x.stride()[:3], *out.stride()[:3], eps, C=dim, RESIDUAL=residual_out is not None, **flags,
    )  # fmt: skip
    return out
