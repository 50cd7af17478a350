"""The Triton kernel behind foldmill.kernels.transition.triton (imports triton: load it lazily).

One program normalises BLOCK_M rows (LayerNorm statistics in fp32), then walks the hidden width
in BLOCK_H slices: a = xn @ fc1[slice].T and b = xn @ fc2[slice].T (fp32 accumulation), the
gate silu(a) * b in fp32, rounded to the compute dtype, then accumulated into
out += gate @ fc3[:, slice].T. The (rows x hidden) intermediate lives only in registers/shared
memory; HBM sees x once and the output once. Widths that are not powers of two (the single
track's 384) are padded to the next power of two with masked loads (zeros contribute nothing).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from foldmill.kernels.triton_dot_operands import dot_operand, rounded
from foldmill.kernels.triton_support import dot_flags, padded_width


@dataclass(frozen=True)
class BlockConfig:
    """Rows per program, hidden units per slice, warps."""

    block_m: int
    block_h: int
    num_warps: int
    num_stages: int = 2


# sm_90 candidates, checked with ptxas for sm_90a (Triton 3.6): all at most 255 registers/thread and
# under the 227 KB shared-memory limit. Pair track (width 128): wgmma tiles; 128 x 64 at 8 warps
# reloads the 192 KB of weights (from L2) once per 128 rows and spills 20 bytes; 64-row tiles at
# 4 warps spill nothing. Single track (384, padded to 512): the fp32 output tile is 4x wider, so
# 16-32 rows per program (no spills). The pair track's 64-row tiles take 255 registers (two programs
# per SM); capped at 168 (three) they ran no faster on the H200 (5.217 against
# 5.237 ms, 2.900 against 2.909).
NARROW_CONFIGS = (BlockConfig(128, 64, 8), BlockConfig(64, 64, 4), BlockConfig(64, 32, 4), BlockConfig(128, 32, 8))
WIDE_CONFIGS = (BlockConfig(32, 32, 4), BlockConfig(16, 32, 4), BlockConfig(16, 64, 4))
NARROW_WIDTH = 128


def candidates(block_d: int, block_o: int) -> tuple[BlockConfig, ...]:
    """The block configurations tried for these padded widths, the default first."""
    return NARROW_CONFIGS if max(block_d, block_o) <= NARROW_WIDTH else WIDE_CONFIGS


@triton.jit(do_not_specialize=["rows"])  # one compilation for every row count
def _transition_kernel(
    x_ptr,
    out_ptr,
    norm_weight_ptr,
    norm_bias_ptr,
    fc1_ptr,
    fc2_ptr,
    fc3_ptr,
    rows,
    x_row_stride,
    eps,
    DIM: tl.constexpr,
    HIDDEN: tl.constexpr,
    OUT_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_O: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_H: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    EMULATE_BF16: tl.constexpr,
):
    row = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    col = tl.arange(0, BLOCK_D)
    out_col = tl.arange(0, BLOCK_O)
    row_ok = row < rows
    col_ok = col < DIM
    out_col_ok = out_col < OUT_DIM
    dtype = fc1_ptr.dtype.element_ty  # the compute dtype: dot operands and the output
    row64 = row.to(tl.int64)  # rows * width exceeds int32 beyond ~16M rows x 128

    # LayerNorm in fp32 (whatever the input dtype), rounded once to the compute dtype for the dots.
    x = tl.load(x_ptr + row64[:, None] * x_row_stride + col[None, :], mask=row_ok[:, None] & col_ok[None, :], other=0.0)
    x = x.to(tl.float32)
    mean = tl.sum(x, axis=1) / DIM
    centred = tl.where(col_ok[None, :], x - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=1) / DIM + eps)
    norm_weight = tl.load(norm_weight_ptr + col, mask=col_ok, other=0.0).to(tl.float32)
    norm_bias = tl.load(norm_bias_ptr + col, mask=col_ok, other=0.0).to(tl.float32)
    normed = rounded(centred * rstd[:, None] * norm_weight[None, :] + norm_bias[None, :], dtype, EMULATE_BF16)

    acc = tl.zeros((BLOCK_M, BLOCK_O), dtype=tl.float32)
    for start in range(0, HIDDEN, BLOCK_H):
        unit = start + tl.arange(0, BLOCK_H)
        unit_ok = unit < HIDDEN
        # fc1/fc2 weights are (HIDDEN, DIM) row-major: load the (DIM, BLOCK_H) slice transposed.
        in_offsets = unit[None, :] * DIM + col[:, None]
        in_mask = col_ok[:, None] & unit_ok[None, :]
        fc1 = dot_operand(tl.load(fc1_ptr + in_offsets, mask=in_mask, other=0.0), EMULATE_BF16)
        fc2 = dot_operand(tl.load(fc2_ptr + in_offsets, mask=in_mask, other=0.0), EMULATE_BF16)
        a = tl.dot(normed, fc1, input_precision=DOT_PRECISION)
        b = tl.dot(normed, fc2, input_precision=DOT_PRECISION)
        gate = rounded(a * tl.sigmoid(a) * b, dtype, EMULATE_BF16)
        # fc3 weight is (OUT_DIM, HIDDEN) row-major: load the (BLOCK_H, OUT_DIM) slice transposed.
        fc3_offsets = out_col[None, :] * HIDDEN + unit[:, None]
        fc3_mask = unit_ok[:, None] & out_col_ok[None, :]
        fc3 = dot_operand(tl.load(fc3_ptr + fc3_offsets, mask=fc3_mask, other=0.0), EMULATE_BF16)
        acc = tl.dot(gate, fc3, acc, input_precision=DOT_PRECISION)

    out_offsets = row64[:, None] * OUT_DIM + out_col[None, :]
    out = rounded(acc, dtype, EMULATE_BF16).to(dtype)  # 2nd cast: exact, interpreter only (else a no-op)
    tl.store(out_ptr + out_offsets, out, mask=row_ok[:, None] & out_col_ok[None, :])


def _prune(configs: list[triton.Config], named_args: dict, **kwargs: object) -> list[triton.Config]:
    """Keep the candidates meant for this width."""
    wanted = {(c.block_m, c.block_h, c.num_warps) for c in candidates(kwargs["BLOCK_D"], kwargs["BLOCK_O"])}
    return [c for c in configs if (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_H"], c.num_warps) in wanted]


# Tuned once per process and (width, hidden, out width, dtypes), at the first call's row count (a
# few hundred ms). That first call must be eager, never inside CUDA-graph capture: benchmarking
# launches and synchronises.
# The winners are kept in Triton's on-disk cache (keyed by GPU target, kernel source and key), so a
# new process, say the next Slurm job's replica, reuses them instead of benchmarking again.
_autotuned_kernel = triton.autotune(
    configs=[
        triton.Config({"BLOCK_M": c.block_m, "BLOCK_H": c.block_h}, num_warps=c.num_warps, num_stages=c.num_stages)
        for c in dict.fromkeys(NARROW_CONFIGS + WIDE_CONFIGS)
    ],
    key=["DIM", "HIDDEN", "OUT_DIM"],
    prune_configs_by={"early_config_prune": _prune},
    cache_results=True,
)(_transition_kernel)


def fused_transition(
    x: Tensor,
    norm_weight: Tensor,
    norm_bias: Tensor,
    fc1_weight: Tensor,
    fc2_weight: Tensor,
    fc3_weight: Tensor,
    eps: float,
    compute_dtype: torch.dtype,
    config: BlockConfig | None = None,
) -> Tensor:
    """fc3(silu(fc1(LN(x))) * fc2(LN(x))) in one kernel; returns (..., out_dim) in `compute_dtype`.

    x: (..., dim) in any float dtype (fp32 residual streams are read as is). The linear weights
    are cast to `compute_dtype` (a no-op when stored so). `config` pins the block sizes (else
    autotuned on CUDA; CPU tensors run the interpreter with the first candidate for the width).
    fp32 compute runs exact fp32 dots ("ieee"), not TF32.
    """
    dim = x.shape[-1]
    hidden, out_dim = fc1_weight.shape[0], fc3_weight.shape[0]
    rows_in = x.reshape(-1, dim)
    if rows_in.stride(-1) != 1:
        rows_in = rows_in.contiguous()
    rows = rows_in.shape[0]
    fc1, fc2, fc3 = (w.to(compute_dtype).contiguous() for w in (fc1_weight, fc2_weight, fc3_weight))
    out = torch.empty(rows, out_dim, device=x.device, dtype=compute_dtype)
    if rows == 0:
        return out.view(*x.shape[:-1], out_dim)
    on_cpu = x.device.type == "cpu"  # CPU tensors only run under Triton's interpreter
    shape_args = {
        "DIM": dim,
        "HIDDEN": hidden,
        "OUT_DIM": out_dim,
        "BLOCK_D": padded_width(dim),
        "BLOCK_O": padded_width(out_dim),
        **dot_flags(x.device, compute_dtype),
    }
    args = (rows_in, out, norm_weight, norm_bias, fc1, fc2, fc3, rows, rows_in.stride(0), eps)
    if config is None and on_cpu:  # no benchmarking in the interpreter
        config = candidates(shape_args["BLOCK_D"], shape_args["BLOCK_O"])[0]
    if config is None:
        grid = lambda meta: (triton.cdiv(rows, meta["BLOCK_M"]),)  # noqa: E731
        _autotuned_kernel[grid](*args, **shape_args)
    else:
        _transition_kernel[(triton.cdiv(rows, config.block_m),)](
            *args,
            **shape_args,
            BLOCK_M=config.block_m,
            BLOCK_H=config.block_h,
            num_warps=config.num_warps,
            num_stages=config.num_stages,
        )
    return out.view(*x.shape[:-1], out_dim)
