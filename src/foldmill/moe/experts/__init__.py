"""Expert backends: every backend computes the same SwiGLU expert MLP over tokens grouped by expert.

A backend is an `ExpertGemm` (how one grouped linear layer runs forward, dgrad and wgrad);
`experts.mlp.grouped_swiglu_experts` chains two of them around the fused SwiGLU, or hands the whole
MLP to a backend whose kernels fuse the SwiGLU into the GEMMs (`quack`).
"""

from __future__ import annotations

from foldmill.errors import FoldmillError
from foldmill.moe.config import ModelConfig
from foldmill.moe.experts.gemm import ExpertGemm, GroupedGemm, LoopGemm

BACKENDS = ("loop", "grouped", "fp8_rowwise", "mxfp8", "quack")
# The precision of each backend's expert GEMMs, whose dense tensor-core peak its MFU is also held
# against (MXFP8 counts as 8-bit, whichever GEMM a GPU runs it on).
GEMM_PRECISION = {"loop": "bf16", "grouped": "bf16", "fp8_rowwise": "fp8", "mxfp8": "fp8", "quack": "bf16"}


def get_backend(
    name: str, fp8_fast_accumulation: bool = ModelConfig.fp8_fast_accumulation,
    mxfp8_store_swiglu_input: bool = ModelConfig.mxfp8_store_swiglu_input,
    keep_weight_copies: bool = ModelConfig.keep_weight_copies,
) -> ExpertGemm:
    """The expert GEMM backend called `name` (one of BACKENDS); `fp8_fast_accumulation` applies to
    fp8_rowwise (experts.fp8_rowwise), the `mxfp8_` settings to mxfp8 (experts.mxfp8), and
    `keep_weight_copies` to both."""
    if name == "loop":
        return LoopGemm()
    if name == "grouped":
        return GroupedGemm()
    if name == "fp8_rowwise":
        from foldmill.moe.experts.fp8_rowwise import Fp8RowwiseGemm

        return Fp8RowwiseGemm(fast_accumulation=fp8_fast_accumulation, keep_weight_copies=keep_weight_copies)
    if name == "mxfp8":
        from foldmill.moe.experts.mxfp8 import MXFP8Gemm

        return MXFP8Gemm(store_swiglu_input=mxfp8_store_swiglu_input, keep_weight_copies=keep_weight_copies)
    if name == "quack":
        from foldmill.moe.experts.quack_fused import QuackGemm

        return QuackGemm()
    raise FoldmillError(f"unknown expert backend {name!r}; choose one of {', '.join(BACKENDS)}")
