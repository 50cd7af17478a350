"""What an exception in a stage means for the run: fail the target, reject it, or retire the replica."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from foldmill.errors import FoldmillError
from foldmill.outputs.validation import InvalidPrediction

# Errors after which the CUDA context is unusable ("sticky"): every later kernel fails too, so
# the replica must go; the target itself may be fine and is tried on another replica.
STICKY_CUDA_MESSAGES = (
    "illegal memory access",
    "illegal instruction",
    "misaligned address",
    "device-side assert",
    "unspecified launch failure",
    "uncorrectable ecc error",
    "cuda error: launch timeout",
    "hardware stack error",
    "cudaerrorillegaladdress",
    "cuda driver error",
    "nvml_success == r internal assert failed",
)


class TargetRejected(FoldmillError):
    """The target cannot be folded with the resources at hand (e.g. out of memory even when chunked)."""


@dataclass
class Outcome:
    """What a stage reports for one target (small: it travels back to the scheduler)."""

    status: str  # ok | failed | rejected | retire
    reason: str = ""
    seconds: float = 0.0
    started: float = 0.0  # Unix time
    worker: str = ""
    info: dict[str, Any] = field(default_factory=dict)


def is_out_of_memory(error: BaseException) -> bool:
    import torch

    if isinstance(error, torch.OutOfMemoryError | MemoryError):
        return True
    message = str(error).lower()
    return isinstance(error, RuntimeError) and ("out of memory" in message or "can't allocate memory" in message)


def is_sticky_cuda_error(error: BaseException) -> bool:
    message = str(error).lower()
    return any(text in message for text in STICKY_CUDA_MESSAGES)


def classify(error: BaseException) -> tuple[str, str]:
    """(status, reason) for an exception raised while processing one target."""
    if isinstance(error, InvalidPrediction):
        return "rejected", error.reason
    if isinstance(error, TargetRejected):
        return "rejected", str(error)
    if is_sticky_cuda_error(error):
        return "retire", f"{type(error).__name__}: {error}"
    if isinstance(error, FoldmillError):
        return "failed", str(error)
    return "failed", f"{type(error).__name__}: {error}"
