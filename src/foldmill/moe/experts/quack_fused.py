"""`quack` backend: bf16 grouped GEMMs from QuACK with the SwiGLU inside their epilogues.

QuACK (`pip install quack-kernels`, Tri Dao's lab) writes its GEMMs in CUTLASS's CuTe DSL: on
Hopper, persistent warp-specialised kernels that run every expert's GEMM in one launch given the
experts' row offsets. Its epilogues compute on the accumulator before the store, which removes
the SwiGLU's own passes over memory:

forward:  h, a = GEMM(x, w13) with a = silu(gate) * up * p in the epilogue;  y = GEMM(a, w2)
backward: grad_h, p * a, grad_p = GEMM(dy, w2) with SwiGLU', the routing weight and the
          sum over F in the epilogue;  dw2 = GEMM(dy^T, p * a);  dx, dw13 = GEMM'(grad_h, w13, x)

so h is never read back by a separate kernel, the gradient of a is never written, and a is not
kept for the backward (its epilogue recomputes p * a from h). The SwiGLU math is QuACK's, in
float32 on the accumulator; foldmill's Triton SwiGLU is the reference it is tested against.

The epilogue works on adjacent column pairs: h and grad_h hold gate and up interleaved
(g0, u0, g1, u1, ...). w13 and its gradient stay [gate; up] (the checkpoint layout): QuACK's
concat layout reads and writes them that way.

Where QuACK cannot run (no CUDA: CPU tests) the same calls run in torch (`TorchCalls`), with h in
[gate | up] layout; the autograd function is the same. Where torch's grouped_mm was measured faster
than QuACK's default tiles on the plain GEMMs (`TORCH_PLAIN_GEMMS`), only the two epilogue GEMMs run
on QuACK (`QuackEpilogueCalls`).
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch
import torch.nn.functional as F

from foldmill.errors import FoldmillError
from foldmill.moe.experts.swiglu import UnfusedSwiGLU, swiglu_backward, swiglu_forward


class TorchCalls:
    """The backend's GEMMs as torch's grouped_mm, and the SwiGLU as foldmill's kernels."""

    @staticmethod
    def linear(x, w, offsets):
        return F.grouped_mm(x, w.transpose(-2, -1), offs=offsets[1:])

    @staticmethod
    def dgrad(dy, w, offsets):
        return F.grouped_mm(dy, w, offs=offsets[1:])

    @staticmethod
    def wgrad(dy, x, offsets):
        return F.grouped_mm(dy.t(), x, offs=offsets[1:])

    @classmethod
    def gated(cls, x, w13, row_probs, offsets):
        h = cls.linear(x, w13, offsets)
        return h, swiglu_forward(h, row_probs)

    @classmethod
    def dgated(cls, dy, w2, h, row_probs, offsets):
        grad_h, grad_probs = swiglu_backward(h, row_probs, cls.dgrad(dy, w2, offsets))
        return grad_h, swiglu_forward(h, row_probs), grad_probs

    @classmethod
    def gated_gradients(cls, grad_h, w13, x, offsets):
        """(grad_x, grad_w13) from grad_h in this class's h layout."""
        return cls.dgrad(grad_h, w13, offsets), cls.wgrad(grad_h, x, offsets)


class QuackCalls:
    """The same calls through QuACK, h and grad_h interleaved. No autotuning (`tuned=False`: it
    compiles every candidate, minutes per shape): default tiles, or measured ones (tile_config)."""

    @staticmethod
    def linear(x, w, offsets):
        from quack.gemm_interface import gemm

        return gemm(x, w.mT, cu_seqlens_m=offsets, tuned=False)

    @staticmethod
    def dgrad(dy, w, offsets):
        from quack.gemm_interface import gemm

        return gemm(dy, w, cu_seqlens_m=offsets, tuned=False)

    @staticmethod
    def wgrad(dy, x, offsets):
        from quack.gemm_interface import gemm

        return gemm(dy.T, x, cu_seqlens_k=offsets, tuned=False)

    @staticmethod
    def gated(x, w13, row_probs, offsets):
        config = tile_config("gated", x.device, x.shape[1], w13.shape[1] // 2)
        return gated_gemm(x, w13, row_probs, offsets, config)

    @staticmethod
    def dgated(dy, w2, h, row_probs, offsets):
        return dgated_gemm(dy, w2, h, row_probs, offsets, tile_config("dgated", dy.device, dy.shape[1], w2.shape[2]))

    @staticmethod
    def gated_gradients(grad_h, w13, x, offsets):
        """(grad_x, grad_w13) from the interleaved grad_h, w13 and its gradient as [gate; up]."""
        from quack.gemm_interface import gemm

        grad_x = gemm(grad_h, w13, cu_seqlens_m=offsets, concat_layout=("B",), tuned=False)
        return grad_x, gemm(grad_h.T, x, cu_seqlens_k=offsets, concat_layout=("out",), tuned=False)


class QuackEpilogueCalls(QuackCalls):
    """QuACK for the two GEMMs with the SwiGLU in their epilogues, torch's grouped_mm for the
    second forward GEMM and the two on grad_h (after one copy of grad_h into [gate | up]): where
    QuACK's default tiles were measured slower on those (TORCH_PLAIN_GEMMS)."""

    linear = staticmethod(TorchCalls.linear)

    @staticmethod
    def gated_gradients(grad_h, w13, x, offsets):
        return TorchCalls.gated_gradients(deinterleave(grad_h), w13, x, offsets)


def deinterleave(h: torch.Tensor) -> torch.Tensor:
    """(rows, 2F) with gate and up interleaved -> [gate | up], contiguous."""
    rows, width = h.shape
    return h.reshape(rows, width // 2, 2).transpose(1, 2).reshape(rows, width)


def gated_gemm(x, w13, row_probs, offsets, config=None):
    """h (rows, 2F, gate and up interleaved) and a = silu(gate) * up * p from one QuACK GEMM;
    `config` a QuACK GemmConfig, None for QuACK's default tiles."""
    out = _scaled_swiglu_epilogue()(x, w13.mT, row_probs=row_probs, cu_seqlens_m=offsets, concat_layout=("B",),
                                    tuned=False, config=config)
    return out["D"], out["postact"]


def dgated_gemm(dy, w2, h, row_probs, offsets, config=None):
    """(grad_h, p * a, grad_p) from dy @ w2 with the SwiGLU's derivative, the routing weight and
    the sum over F in QuACK's epilogue; `config` as for gated_gemm."""
    from quack.gemm_interface import gemm_dgated

    return gemm_dgated(dy, w2, h, activation="swiglu", colvec_scale=row_probs, colvec_reduce=True,
                       cu_seqlens_m=offsets, tuned=False, config=config)


# Tiles of the two epilogue GEMMs by (kernel, GPU name as torch gives it, hidden, ffn), where
# measured faster than QuACK's default in CUDA graphs, as the captured step runs them (`foldmill
# bench moe --sections quack-tiles`, docs/benchmarks/moe.md). By GPU, not compute capability: the
# H100 and the H200 (SXM) share sm_90 but not the best tiles. Of the 18 configurations QuACK's
# autotuner tries, 128 x 128 pingpong: at bio_8x1b's experts on the H200 with a 1 x 2 cluster, the
# gated GEMM 0.72 ms against the default's 0.78, the dgated 0.49 against 0.68; on the H100 the
# dgated 0.53 against 0.71-0.73 (1 x 2) and at Mixtral-8x7B's experts 3.21 against 3.45-3.52
# (2 x 1), while its gated GEMMs run fastest, or within 0.4%, on the default (0.71-0.72 ms at
# bio_8x1b, 0.85 pinned). Other shapes and GPUs keep the default.
PINGPONG_128X128 = {"tile_m": 128, "tile_n": 128, "pingpong": True, "cluster_m": 1, "cluster_n": 2}
PINGPONG_128X128_CLUSTER_2X1 = {**PINGPONG_128X128, "cluster_m": 2, "cluster_n": 1}
H200, H100 = "NVIDIA H200", "NVIDIA H100 80GB HBM3"
MEASURED_TILES = {
    ("gated", H200, 2048, 4096): PINGPONG_128X128,
    ("dgated", H200, 2048, 4096): PINGPONG_128X128,
    ("dgated", H100, 2048, 4096): PINGPONG_128X128,
    ("dgated", H100, 4096, 14336): PINGPONG_128X128_CLUSTER_2X1,
}


# Expert shapes by GPU where torch's grouped_mm beats QuACK's default tiles on the backend's plain
# GEMMs, so that only the epilogue GEMMs stay on QuACK (QuackEpilogueCalls); `foldmill bench moe
# --sections quack-tiles` times both. On the H100 at
# Mixtral-8x7B's experts, in CUDA graphs at 8,192 and 32,768 tokens: a @ w2 2.70 and 11.30 ms on
# torch against 3.08 and 16.72, the gradient of x from grad_h 6.29 and 27.27 (the copy into
# [gate | up] included) against 8.14 and 38.11, that of w13 6.65 and 23.77 against 7.07 and 34.61,
# the same bits for w13. At bio_8x1b's experts QuACK is as fast or faster there, and the copy
# alone (0.36 ms at 8,192 tokens) costs more than torch would save.
TORCH_PLAIN_GEMMS = {(H100, 4096, 14336)}


def calls_for_experts(x: torch.Tensor, hidden: int, ffn: int) -> type[TorchCalls | QuackCalls]:
    """calls_for(x), with torch's GEMMs in place of QuACK's plain ones where measured faster."""
    calls = calls_for(x)
    if calls is QuackCalls and (torch.cuda.get_device_name(x.device), hidden, ffn) in TORCH_PLAIN_GEMMS:
        return QuackEpilogueCalls
    return calls


@functools.cache
def tile_config(kernel: str, device: torch.device, hidden: int, ffn: int):
    """The measured GemmConfig of `kernel` (gated or dgated) for this GPU and expert shape, or None
    (QuACK's default)."""
    tiles = MEASURED_TILES.get((kernel, torch.cuda.get_device_name(device), hidden, ffn))
    if tiles is None:
        return None
    from quack.gemm_config import GemmConfig

    major = torch.cuda.get_device_capability(device)[0]
    return GemmConfig(**tiles, is_dynamic_persistent=False, device_capacity=major)


@functools.cache
def _scaled_swiglu_epilogue():
    """The first GEMM's epilogue: store the accumulator as h and a = silu(gate) * up * p."""
    from quack.activation import gate_fn_map
    from quack.epilogue import gemm_epilogue, pack, unpack
    from quack.epilogue.ops import ColVecLoad

    swiglu = gate_fn_map["swiglu"]

    def scaled_swiglu(acc, row_probs):
        gate, up = unpack(acc)
        return {"D": pack(gate, up), "postact": swiglu(gate, up) * row_probs}

    return gemm_epilogue(outputs=("postact",), ops={"row_probs": ColVecLoad("row_probs")},
                         mode="acc_pair")(scaled_swiglu)


def calls_for(tensor: torch.Tensor) -> type[TorchCalls | QuackCalls]:
    """QuACK on CUDA, torch elsewhere."""
    if not tensor.is_cuda:
        return TorchCalls
    problem = _quack_problem()
    if problem:
        raise FoldmillError(problem)
    return QuackCalls


@functools.cache
def _quack_problem() -> str | None:
    """Why the quack backend cannot run on CUDA here, or None; once per process, not per call."""
    if not quack_installed():
        return "expert backend quack needs QuACK on CUDA: pip install quack-kernels"
    spec = importlib.util.find_spec("cutlass")
    return cutlass_location_problem(spec.origin if spec else None)


def cutlass_location_problem(origin: str | None) -> str | None:
    """Why QuACK would refuse its epilogues with CUTLASS's DSL installed at `origin`, or None.

    QuACK keys each compiled epilogue on the code the epilogue calls, and keys CUTLASS's DSL by
    name only when it is installed under a site-packages or dist-packages folder; installed
    elsewhere (pip --target onto PYTHONPATH) QuACK raises a TypeError on its own SwiGLU epilogues.
    """
    if origin is None or any(f"{os.sep}{folder}{os.sep}" in origin for folder in ("site-packages", "dist-packages")):
        return None
    return (f"expert backend quack: QuACK compiles its epilogues only with CUTLASS's DSL installed under a "
            f"site-packages folder, and it is at {origin}: pip install it into the environment, not with --target")


@functools.cache
def quack_installed() -> bool:
    """Whether QuACK (quack-kernels) is installed, without importing it."""
    return importlib.util.find_spec("quack") is not None


def row_offsets(ends: torch.Tensor) -> torch.Tensor:
    """[0, ends...] as int32: QuACK's cu_seqlens."""
    return F.pad(ends.to(torch.int32), (1, 0))


class FusedSwiGLUExperts(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, row_probs, w13, w2, ends, recompute: bool):
        calls, offsets = calls_for_experts(x, w13.shape[2], w2.shape[2]), row_offsets(ends)
        ctx.calls, ctx.recompute, ctx.probs_dtype = calls, recompute, row_probs.dtype
        row_probs = row_probs.float().contiguous()
        h, a = calls.gated(x, w13, row_probs, offsets)
        y = calls.linear(a, w2, offsets)
        ctx.save_for_backward(x, row_probs, w13, w2, offsets, None if recompute else h)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x, row_probs, w13, w2, offsets, h = ctx.saved_tensors
        calls, grad_y = ctx.calls, grad_y.contiguous()
        if ctx.recompute:  # the forward's own kernel again, so h is bit for bit the forward's
            h, _ = calls.gated(x, w13, row_probs, offsets)
        grad_h, scaled_a, grad_probs = calls.dgated(grad_y, w2, h, row_probs, offsets)
        grad_w2 = calls.wgrad(grad_y, scaled_a, offsets)
        grad_x, grad_w13 = calls.gated_gradients(grad_h, w13, x, offsets)
        return grad_x, grad_probs.to(ctx.probs_dtype), grad_w13, grad_w2, None, None


class QuackGemm(UnfusedSwiGLU):
    """One grouped linear layer through QuACK's GEMMs (`ExpertGemm`), and the expert MLP with the
    SwiGLU fused into them (`swiglu_experts`), which is what the model runs."""

    name = "quack"
    pad_multiple = 1
    # An expert no token chose gets one zero row, so that its weight gradient is a GEMM's output
    # (zeros) whatever QuACK does with an empty group of the contraction.
    nonempty_groups = True

    def forward(self, x, w, ends):
        return calls_for(x).linear(x, w, row_offsets(ends)), x

    def backward(self, dy, w, saved, ends):
        calls, offsets = calls_for(dy), row_offsets(ends)
        return calls.dgrad(dy, w, offsets), calls.wgrad(dy, saved, offsets)

    @staticmethod
    def swiglu_experts(x, row_probs, w13, w2, ends, recompute: bool) -> torch.Tensor:
        """experts.mlp.grouped_swiglu_experts, run by this backend's fused kernels."""
        return FusedSwiGLUExperts.apply(x, row_probs, w13, w2, ends, recompute)
