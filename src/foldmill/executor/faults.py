"""What an exception in a stage means for the run (fail the target, reject it, or retire the replica),
and why a worker process died (out of memory, or a crash)."""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any

from foldmill.errors import FoldmillError
from foldmill.outputs.validation import InvalidPrediction

log = logging.getLogger(__name__)

# Ray's exit type of a worker its memory monitor killed (the node, or the job's cgroup, near its limit).
RAY_OOM_EXIT = "NODE_OUT_OF_MEMORY"
EXIT_LOOKUP_SECONDS = 2.0  # how long the driver waits for Ray to record a dead worker's exit

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


def worker_exit(pid: int) -> tuple[str, str]:
    """How Ray recorded the end of worker process `pid`: (exit type, detail); ("", "") when unknown.

    Read from Ray's worker table: the error a caller gets when an actor is restarted says only that
    it restarted, and no public API gives a dead worker's exit reason, so this uses Ray's state
    accessor and treats any failure to read it as unknown. Ray records the exit moments after the
    caller sees the error, hence the short wait.
    """
    if not pid:
        return "", ""
    deadline = time.monotonic() + EXIT_LOOKUP_SECONDS
    while True:
        try:
            from ray._private.state import state
            from ray.core.generated import common_pb2, gcs_pb2

            for raw in state._connect_and_get_accessor().get_worker_table():
                worker = gcs_pb2.WorkerTableData.FromString(raw)
                if worker.pid == pid and not worker.is_alive:
                    return common_pb2.WorkerExitType.Name(worker.exit_type), worker.exit_detail
        except Exception as error:  # noqa: BLE001 - a Ray internal that may change: unknown, not a failed run
            log.debug("worker table unreadable: %s", error)
            return "", ""
        if time.monotonic() > deadline:
            return "", ""
        time.sleep(0.1)


def crash_reason(pid: int, n_tokens: int) -> str:
    """Why the worker process `pid` died under a target of `n_tokens` tokens, in the fold table's words."""
    exit_type, detail = worker_exit(pid)
    if exit_type != RAY_OOM_EXIT:
        return "the worker process died"
    usage = re.search(r"was (\S+ used / \S+ limit)", detail)
    where = f"memory {usage.group(1)}" if usage else "memory near its limit"
    return f"out of memory ({n_tokens} tokens; the worker was killed by Ray's memory monitor, {where})"
