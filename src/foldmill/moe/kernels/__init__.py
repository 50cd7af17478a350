"""Triton kernels for the MoE layer (CUDA only; imported lazily so CPU installs need no Triton).

mx_quant.py        MXFP8 quantizer (bit-exact with quant/mx_reference.py) and the one-pass exact
                   bf16 values of a tensor's MXFP8 copies in both block directions (Hopper route)
fp8_quant.py       FP8 quantizers: row-wise, and per (expert group, column) written transposed (wgrad),
                   or both copies from the same two passes
adamw.py           AdamW update that applies the gradient-clipping factor as it reads each gradient
mx_grouped_gemm.py MXFP8 grouped GEMMs: tl.dot_scaled (native block-scaled MMA, sm100 route), and
                   FP8 or bf16 MMAs per 32-wide block with scales applied in fp32 (Hopper comparison)
swiglu.py          SwiGLU x routing weight and its backward, optionally writing the exact values of
                   their outputs' MXFP8 copies instead of the outputs (MXFP8 backend on Hopper)
rope.py            rotary embedding of q and k, forward and backward one pass each
rms_norm.py        residual add + RMSNorm, forward and backward one pass each
cast.py            cast to the compute dtype whose gradient converts back in a vectorized kernel
permute.py         token permute (rows + routing weights) and unpermute (sum of each token's rows)
routing.py         the dropless routing plan (each slot's row in the expert-sorted buffer), two launches
router.py          the router's top-k softmax: weights, experts and load-balancing sums, one launch each way
router_logits.py   the router's float32 logits x @ w.T and both gradients, FMAs at memory speed, one launch each way
grad_norm.py       float32 sum of squares of many tensors in one launch (the clipping norm)
grid.py            the host code's grid arithmetic in plain Python (Triton's costs the host more)
"""

from __future__ import annotations

import functools
import importlib.util

import torch


@functools.cache
def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def use_triton(tensor: torch.Tensor) -> bool:
    """True where the Triton kernels apply: a CUDA tensor and Triton installed."""
    return tensor.is_cuda and _triton_installed()


def compute_capability(tensor: torch.Tensor) -> tuple[int, int]:
    return torch.cuda.get_device_capability(tensor.device)
