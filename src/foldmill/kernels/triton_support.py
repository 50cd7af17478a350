"""What foldmill's Triton backends share on the host side (no triton import here, so CPU machines
without Triton load it): whether Triton can run, tile widths, and when a backend hands the call to
its PyTorch reference instead."""

from __future__ import annotations

import functools

import torch
from torch import Tensor

MIN_WIDTH = 16  # tl.dot's smallest operand dimension


@functools.cache
def available() -> bool:
    """Triton importable and a CUDA device present (never raises)."""
    try:
        import triton  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means "not here"
        return False
    return torch.cuda.is_available()


def padded_width(width: int) -> int:
    """A tile row's width: the next power of two (tl.arange's rule), at least MIN_WIDTH."""
    return max(MIN_WIDTH, 1 << (width - 1).bit_length())


def records_autograd(*tensors: Tensor | None) -> bool:
    """Whether autograd records through any of these (the kernels have no backward pass)."""
    return torch.is_grad_enabled() and any(tensor is not None and tensor.requires_grad for tensor in tensors)


def dot_flags(device: torch.device, compute_dtype: torch.dtype) -> dict[str, object]:
    """The DOT_PRECISION and EMULATE_BF16 constants of foldmill's kernels for tensors on `device`.

    CPU tensors only run under Triton's interpreter, whose bf16 is emulated in fp32 (see
    triton_dot_operands.rounded) with exact fp32 dots; fp32 compute gets exact fp32 dots ("ieee")
    on the GPU too; otherwise the tensor cores' precision.
    """
    emulate_bf16 = device.type == "cpu" and compute_dtype == torch.bfloat16
    return {"DOT_PRECISION": "ieee" if compute_dtype == torch.float32 or emulate_bf16 else "tf32", "EMULATE_BF16": emulate_bf16}
