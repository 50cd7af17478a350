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
[gate | up] layout; the autograd function is the same. Each QuACK GEMM of the expert MLP runs on
QuACK's default tiles unless others were measured faster for the GPU and expert shape
(`MEASURED_TILES`).
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch
import torch.nn.functional as F

from foldmill.errors import FoldmillError, import_failure
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

    down = linear  # a @ w2, the expert MLP's second forward GEMM
    grad_w2 = wgrad

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
    """The same calls through QuACK, h and grad_h interleaved. No autotuning (it compiles every
    candidate, minutes per shape): the expert MLP's GEMMs run on measured tiles where there are
    some (tile_config), QuACK's default otherwise, as does a single grouped linear layer."""

    @staticmethod
    def linear(x, w, offsets):
        return plain_gemm(x, w.mT, None, cu_seqlens_m=offsets)

    @staticmethod
    def dgrad(dy, w, offsets):
        return plain_gemm(dy, w, None, cu_seqlens_m=offsets)

    @staticmethod
    def wgrad(dy, x, offsets):
        return plain_gemm(dy.T, x, None, cu_seqlens_k=offsets)

    @staticmethod
    def down(a, w2, offsets):
        return down_gemm(a, w2, offsets, tile_config("down", a.device, w2.shape[1], w2.shape[2]))

    @staticmethod
    def grad_w2(dy, scaled_a, offsets):
        return grad_w2_gemm(dy, scaled_a, offsets, tile_config("grad_w2", dy.device, dy.shape[1], scaled_a.shape[1]))

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
        hidden, ffn = x.shape[1], w13.shape[1] // 2
        return (grad_x_gemm(grad_h, w13, offsets, tile_config("grad_x", x.device, hidden, ffn)),
                grad_w13_gemm(grad_h, x, offsets, tile_config("grad_w13", x.device, hidden, ffn)))


def plain_gemm(a, b, config, **kwargs):
    """QuACK's grouped GEMM a @ b without an epilogue, on `config`'s tiles (a GemmConfig) or, for
    None, QuACK's default. QuACK's `gemm` takes no tiles, so a pinned call goes to the function its
    autotuner wraps, with the output allocated here as `gemm` would."""
    from quack.gemm_interface import gemm, gemm_tuned

    if config is None:
        return gemm(a, b, tuned=False, **kwargs)
    cu_seqlens_k = kwargs.get("cu_seqlens_k")
    if cu_seqlens_k is None:
        out = a.new_empty(a.shape[0], b.shape[-1])
    else:
        out = a.new_empty(cu_seqlens_k.shape[0] - 1, a.shape[0], b.shape[-1])
    gemm_tuned.fn(a, b, out, config=config, **kwargs)
    return out


def down_gemm(a, w2, offsets, config=None):
    """y = a @ w2 per expert; `config` a QuACK GemmConfig, None for QuACK's default tiles."""
    return plain_gemm(a, w2.mT, config, cu_seqlens_m=offsets)


def grad_w2_gemm(dy, scaled_a, offsets, config=None):
    """w2's gradient, dy^T @ (p * a) per expert; `config` as for down_gemm."""
    return plain_gemm(dy.T, scaled_a, config, cu_seqlens_k=offsets)


def grad_x_gemm(grad_h, w13, offsets, config=None):
    """x's gradient from the interleaved grad_h and w13 as [gate; up]; `config` as for down_gemm."""
    return plain_gemm(grad_h, w13, config, cu_seqlens_m=offsets, concat_layout=("B",))


def grad_w13_gemm(grad_h, x, offsets, config=None):
    """w13's gradient as [gate; up] from the interleaved grad_h; `config` as for down_gemm."""
    return plain_gemm(grad_h.T, x, config, cu_seqlens_k=offsets, concat_layout=("out",))


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


# Tiles of the expert MLP's GEMMs by (kernel, GPU name as torch gives it, hidden, ffn), where
# measured faster than QuACK's default in CUDA graphs, as the captured step runs them (`foldmill
# bench moe --sections quack-tiles`, docs/benchmarks/moe.md). Kernels: the two epilogue GEMMs
# (gated, dgated), a @ w2 (down), and the plain GEMMs of the backward (grad_w2; grad_x and
# grad_w13 from the interleaved grad_h). By GPU, not compute capability: the H100 and the H200
# (SXM) share sm_90 but not the best tiles. At bio_8x1b's experts, 8,192 tokens: on the H200,
# 128 x 128 pingpong with a 1 x 2 cluster runs the gated GEMM in 0.72 ms against the default's
# 0.78 and the dgated in 0.49 against 0.68; on the H100 the dgated in 0.53 against 0.71-0.73,
# while its gated GEMM runs fastest on the default. At Mixtral-8x7B's experts on the H100: the
# dgated 3.21 against 3.45-3.52 (pingpong, 2 x 1), a @ w2 2.42 against 2.94 (256 x 160
# cooperative, 2 x 1), x's gradient 5.25 against 7.51 (256 x 192 cooperative, 1 x 2) and w13's
# 5.23 against 6.88 (192 x 128 pingpong, 1 x 2); the last three beat torch's grouped_mm (2.97 ms,
# and 12.60 for both gradients with grad_h copied into [gate | up] for it). At bio_8x1b's experts on
# the H100, a @ w2 and x's and w13's gradients on their fastest tiles (up to 12% ahead per GEMM) left
# the captured step unchanged (0.2%), so they keep the default, as do other shapes and GPUs.
PINGPONG_128X128 = {"tile_m": 128, "tile_n": 128, "pingpong": True, "cluster_m": 1, "cluster_n": 2}
H200, H100 = "NVIDIA H200", "NVIDIA H100 80GB HBM3"
MEASURED_TILES = {
    ("gated", H200, 2048, 4096): PINGPONG_128X128,
    ("dgated", H200, 2048, 4096): PINGPONG_128X128,
    ("dgated", H100, 2048, 4096): PINGPONG_128X128,
    ("dgated", H100, 4096, 14336): {**PINGPONG_128X128, "cluster_m": 2, "cluster_n": 1},
    ("down", H100, 4096, 14336): {"tile_m": 256, "tile_n": 160, "pingpong": False, "cluster_m": 2, "cluster_n": 1},
    ("grad_x", H100, 4096, 14336): {"tile_m": 256, "tile_n": 192, "pingpong": False, "cluster_m": 1, "cluster_n": 2},
    ("grad_w13", H100, 4096, 14336): {"tile_m": 192, "tile_n": 128, "pingpong": True, "cluster_m": 1, "cluster_n": 2},
}


@functools.cache
def tile_config(kernel: str, device: torch.device, hidden: int, ffn: int):
    """The measured GemmConfig of `kernel` (a kernel of MEASURED_TILES) for this GPU and expert
    shape, or None (QuACK's default)."""
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
    failure = import_failure("quack.gemm_interface")  # it loads CUTLASS's DSL
    if failure:
        return (f"expert backend quack: QuACK is installed but does not import ({failure}); "
                f"reinstall quack-kernels and nvidia-cutlass-dsl together")
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
        calls, offsets = calls_for(x), row_offsets(ends)
        ctx.calls, ctx.recompute, ctx.probs_dtype = calls, recompute, row_probs.dtype
        row_probs = row_probs.float().contiguous()
        h, a = calls.gated(x, w13, row_probs, offsets)
        y = calls.down(a, w2, offsets)
        ctx.save_for_backward(x, row_probs, w13, w2, offsets, None if recompute else h)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x, row_probs, w13, w2, offsets, h = ctx.saved_tensors
        calls, grad_y = ctx.calls, grad_y.contiguous()
        if ctx.recompute:  # the forward's own kernel again, so h is bit for bit the forward's
            h, _ = calls.gated(x, w13, row_probs, offsets)
        grad_h, scaled_a, grad_probs = calls.dgated(grad_y, w2, h, row_probs, offsets)
        grad_w2 = calls.grad_w2(grad_y, scaled_a, offsets)
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
