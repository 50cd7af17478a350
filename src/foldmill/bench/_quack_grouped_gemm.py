"""QuACK's grouped GEMMs, a contender in the gemm section of `foldmill bench moe` (CuTe DSL, bf16).

QuACK (`quack-kernels`) writes its GEMMs in CUTLASS's CuTe DSL; on Hopper they are persistent,
warp-specialised kernels (TMA loads, warpgroup MMAs). Given the experts' row offsets it runs every
expert's GEMM in one launch: over each expert's rows (`cu_seqlens_m`: forward and dgrad) or
contracting over them (`cu_seqlens_k`: wgrad), so it covers all three GEMMs of an expert layer
where torch's `grouped_mm` is the baseline. The rows use QuACK's default tile configuration
(`tuned=False`): autotuning compiles every candidate configuration, minutes per shape.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from quack.gemm_interface import gemm


def quack_cases(x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor, ends: torch.Tensor
                ) -> list[tuple[str, Callable[[], torch.Tensor], Callable[[], torch.Tensor]]]:
    """(direction, the QuACK call, the float32 product it computes) for the forward (x @ w[e].T),
    dgrad (dy @ w[e]) and wgrad (dy[rows of e].T @ x[rows of e])."""
    import torch.nn.functional as F

    offsets = torch.cat([ends.new_zeros(1), ends]).to(torch.int32)
    return [
        ("fwd", functools.partial(gemm, x, w.mT, cu_seqlens_m=offsets, tuned=False),
         lambda: F.grouped_mm(x.float(), w.float().mT, offs=ends)),
        ("dgrad", functools.partial(gemm, dy, w, cu_seqlens_m=offsets, tuned=False),
         lambda: F.grouped_mm(dy.float(), w.float(), offs=ends)),
        ("wgrad", functools.partial(gemm, dy.T, x, cu_seqlens_k=offsets, tuned=False),
         lambda: F.grouped_mm(dy.float().T, x.float(), offs=ends)),
    ]
