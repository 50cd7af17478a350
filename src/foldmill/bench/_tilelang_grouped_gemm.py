"""A TileLang grouped GEMM, a contender in the gemm section of `foldmill bench moe` (Hopper, bf16).

TileLang lowers the tile program below to TMA loads and warpgroup MMAs with a producer warpgroup
feeding two consumer warpgroups (warp specialization), so it is the quickest route to a Hopper
grouped GEMM written in Python; the bench holds it against torch's `grouped_mm` (CUTLASS) on the
same operands. Each program computes one (block_m x block_n) tile of one expert's rows: it finds
its expert by walking the experts' row counts, loads whole tiles (rows past the expert's last one
are computed and not stored) and stores only the expert's rows. The grid has exactly one program
per tile, counted on the host from `ends` when the call is made ready (one synchronization, outside
the timed launches); a training step would have to count the tiles on the device.

Only the forward (x @ w[e].T) and dgrad (dy @ w[e]) layouts: wgrad contracts over each expert's
rows and would need the rows past an expert's end masked inside the K loop.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import tilelang
import tilelang.language as T
import torch

# (block_m, block_n, block_k, stages): of the tile shapes tried on the H200, the fastest at most of
# the bench's shapes (two consumer warpgroups, each owning whole rows of the tile).
_TILES = {True: (128, 256, 64, 3), False: (256, 128, 64, 3)}


@functools.cache
def _kernel(rows: int, k: int, n: int, experts: int, tiles_m: int, transpose_w: bool):
    block_m, block_n, block_k, stages = _TILES[transpose_w]

    @tilelang.jit(target={"kind": "cuda", "arch": "sm_90a"})
    def grouped(x, w, ends):
        x: T.Tensor((rows, k), T.bfloat16)
        w: T.Tensor((experts, n, k) if transpose_w else (experts, k, n), T.bfloat16)
        ends: T.Tensor((experts,), T.int32)
        y = T.empty((rows, n), T.bfloat16)
        with T.Kernel(T.ceildiv(n, block_n), tiles_m, threads=256) as (bx, by):
            x_tile = T.alloc_shared((block_m, block_k), T.bfloat16)
            w_tile = T.alloc_shared((block_n, block_k) if transpose_w else (block_k, block_n), T.bfloat16)
            acc = T.alloc_fragment((block_m, block_n), T.float32)
            y_tile = T.alloc_shared((block_m, block_n), T.bfloat16)
            expert = T.alloc_var(T.int32)
            row0 = T.alloc_var(T.int32)
            valid = T.alloc_var(T.int32)
            tiles_before = T.alloc_var(T.int32)
            start = T.alloc_var(T.int32)
            expert = 0
            row0 = 0
            valid = 0
            tiles_before = 0
            start = 0
            for e in T.serial(experts):
                tiles = T.ceildiv(ends[e] - start, block_m)
                if tiles_before <= by < tiles_before + tiles:
                    expert = e
                    row0 = start + (by - tiles_before) * block_m
                    valid = T.min(block_m, ends[e] - row0)
                tiles_before = tiles_before + tiles
                start = ends[e]
            T.clear(acc)
            for step in T.Pipelined(T.ceildiv(k, block_k), num_stages=stages):
                T.copy(x[row0, step * block_k], x_tile)
                if transpose_w:
                    T.copy(w[expert, bx * block_n, step * block_k], w_tile)
                else:
                    T.copy(w[expert, step * block_k, bx * block_n], w_tile)
                T.gemm(x_tile, w_tile, acc, transpose_B=transpose_w, policy=T.GemmWarpPolicy.FullRow)
            T.copy(acc, y_tile)
            for i, j in T.Parallel(block_m, block_n):
                if i < valid:
                    y[row0 + i, bx * block_n + j] = y_tile[i, j]
        return y

    return grouped


def tilelang_grouped_mm(w: torch.Tensor, ends: torch.Tensor, transpose_w: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    """The grouped product with w (experts, n, k) if transpose_w (the forward), else (experts, k, n)
    (dgrad), for experts' rows ending at `ends` (int32): a call taking x (rows, k) bf16 and returning
    (rows, n) bf16. Counting the tiles reads `ends` on the host, once, here, not in the timed call."""
    experts = w.shape[0]
    k, n = (w.shape[2], w.shape[1]) if transpose_w else (w.shape[1], w.shape[2])
    block_m = _TILES[transpose_w][0]
    sizes = torch.diff(ends, prepend=ends.new_zeros(1))
    tiles_m = int(((sizes + block_m - 1) // block_m).sum())
    kernel = _kernel(int(ends[-1]), k, n, experts, tiles_m, transpose_w)
    return lambda x: kernel(x, w, ends)
