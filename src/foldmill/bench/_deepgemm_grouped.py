"""DeepGEMM's Hopper FP8 grouped GEMMs, contenders in the gemm section of `foldmill bench moe`.

DeepGEMM (deepseek-ai/DeepGEMM) runs DeepSeek-V3's block-scaled recipe on sm_90, which torch's
scaled grouped GEMM refuses there: activations with one scale per row per 128 columns of the
contraction, weights with one per 128 x 128 block (forward and dgrad, `m_grouped_fp8_gemm_nt_contiguous`),
and for the weight gradient both operands with one scale per column per 128 rows of each expert
(`k_grouped_fp8_gemm_nt_contiguous`, which adds into a float32 output). Its groups must start on
multiples of 128 rows, and the weight gradient takes each expert's row count from the host.

The rows time the GEMMs on ready operands, as the bench's other library rows do; the operands are
made with DeepGEMM's own torch casts, outside the timed calls.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable

import deep_gemm
import torch
import torch.nn.functional as F
from deep_gemm.utils.math import per_block_cast_to_fp8, per_channel_cast_to_fp8, per_token_cast_to_fp8

NAME = "DeepGEMM fp8 1x128 / 128x128"


def deepgemm_rows(record: Callable[..., None], error_against: Callable[..., dict], x: torch.Tensor, w: torch.Tensor,
                  dy: torch.Tensor, ends: torch.Tensor) -> None:
    """Forward, dgrad and weight-gradient rows; one row with the reason where the groups do not fit."""
    alignment = deep_gemm.get_mk_alignment_for_contiguous_layout()
    groups = list(itertools.pairwise([0, *ends.tolist()]))
    rows = [stop - start for start, stop in groups]
    if any(count % alignment for count in rows):
        record(NAME, None, "fp8", passes=0,
               failure=ValueError(f"DeepGEMM needs every expert's rows on a multiple of {alignment}, got {rows}"))
        return
    experts = len(rows)
    group_of_row = torch.repeat_interleave(torch.arange(experts, dtype=torch.int32, device=x.device),
                                           torch.tensor(rows, device=x.device))
    for direction, activations, weights in (("fwd", x, w), ("dgrad", dy, w.transpose(-2, -1).contiguous())):
        run = _m_grouped(activations, weights, group_of_row)
        want = functools.partial(F.grouped_mm, activations.float(), weights.float().transpose(-2, -1), offs=ends)
        record(f"{NAME} {direction} (GEMM only)", run, "fp8", check=functools.partial(error_against, run, want))
    run = _k_grouped(dy, x, groups)
    want = functools.partial(F.grouped_mm, dy.float().t(), x.float(), offs=ends)
    record(f"{NAME} K-grouped wgrad, float32 out (GEMM only)", run, "fp8",
           check=functools.partial(error_against, run, want))


def _m_grouped(activations: torch.Tensor, weights: torch.Tensor, group_of_row: torch.Tensor) -> Callable:
    """activations (rows, K) @ weights[e] (N, K)^T per row's expert, as a ready call."""
    data, scales = per_token_cast_to_fp8(activations, use_ue8m0=False)
    a = (data, deep_gemm.get_mn_major_tma_aligned_tensor(scales))
    blocks = [per_block_cast_to_fp8(weight, use_ue8m0=False) for weight in weights]
    b = (torch.stack([data for data, _ in blocks]), torch.stack([scales for _, scales in blocks]))
    out = torch.empty(activations.shape[0], weights.shape[1], dtype=torch.bfloat16, device=activations.device)

    def run() -> torch.Tensor:
        deep_gemm.m_grouped_fp8_gemm_nt_contiguous(a, b, out, group_of_row)
        return out

    return run


def _k_grouped(dy: torch.Tensor, x: torch.Tensor, groups: list[tuple[int, int]]) -> Callable:
    """dy[group]^T @ x[group] per expert (rows start:stop) into a float32 (experts, N, K), as a ready
    call (each call adds into the output, so only its first call gives the product)."""

    def per_group(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Each expert's block transposed to (columns, rows) and flattened; scales (columns, rows / 128).
        casts = [per_channel_cast_to_fp8(values[start:stop], use_ue8m0=False) for start, stop in groups]
        return (torch.cat([data.t().contiguous().flatten() for data, _ in casts]),
                torch.cat([scales for _, scales in casts]).t())

    a, b = per_group(dy), per_group(x)
    out = torch.zeros(len(groups), dy.shape[1], x.shape[1], dtype=torch.float32, device=dy.device)
    rows = [stop - start for start, stop in groups]
    counts = torch.tensor(rows, dtype=torch.int32, device=dy.device)

    def run() -> torch.Tensor:
        deep_gemm.k_grouped_fp8_gemm_nt_contiguous(a, b, out, rows, counts, out)
        return out

    return run
