"""The Ray actor behind every stage: featurize, fold (a model replica) and write.

A worker builds its stage once (a model replica loads its model here, not per target) and then
processes one target at a time. Errors never escape: each becomes an `Outcome` the scheduler
turns into a record, so one bad target cannot take the actor down. Only a crash of the process
itself (segfault, kill, lost node) reaches the scheduler as an actor error.
"""

from __future__ import annotations

import os
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any

import ray

from foldmill.errors import FoldmillError
from foldmill.executor.faults import Outcome, classify


class StageWorker:
    def __init__(self, name: str, build: Callable[[], Callable[[Any], Any]], threads: int) -> None:
        self.started_at = time.time()  # the process is up and its imports done (the driver reports how long that took)
        import torch

        torch.set_num_threads(max(1, threads))
        gpus = ray.get_gpu_ids() if ray.is_initialized() else []
        # A GPU replica is named after the GPU Ray gave it, so the fold table says which GPU folded what.
        self.name = f"{name}{gpus[0] if gpus else ''}@{socket.gethostname()}"
        # A stage that cannot be built (a bad checkpoint, say) is reported by `ready`, not raised:
        # Ray would pass the driver only a text dump of the exception.
        self.stage: Callable[[Any], Any] | None = None
        self.build_error = ""
        clock = time.perf_counter()
        try:
            self.stage = build()
        except FoldmillError as error:
            self.build_error = str(error)
        except Exception as error:  # noqa: BLE001 - reported to the driver with its traceback
            self.build_error = f"{type(error).__name__}: {error}\n{traceback.format_exc()}"
        self.build_seconds = time.perf_counter() - clock

    def ready(self) -> dict[str, Any]:
        """Name, pid, token budget (model replicas), the seconds the stage took to build (and its own
        split of them, if it keeps one) and the error that kept it from being built, if any."""
        return {
            "name": self.name,
            "pid": os.getpid(),
            "token_budget": getattr(self.stage, "token_budget", None),
            "started_at": self.started_at,
            "build_seconds": self.build_seconds,
            "build_split": dict(getattr(self.stage, "build_seconds", {})),
            "error": self.build_error,
        }

    @ray.method(num_returns=2)
    def process(self, payload: Any) -> tuple[Outcome, Any]:
        started, clock = time.time(), time.perf_counter()
        if self.stage is None:  # restarted after a crash, and could not build its stage again
            return Outcome("retire", f"could not start: {self.build_error}", 0.0, started, self.name), None
        try:
            result = self.stage(payload)
        except Exception as error:  # noqa: BLE001 - every error becomes an outcome, by design
            status, reason = classify(error)
            # A user-facing error explains itself; anything else is a bug worth its traceback in the log.
            info = {} if isinstance(error, FoldmillError) else {"traceback": traceback.format_exc()}
            return Outcome(status, reason, time.perf_counter() - clock, started, self.name, info), None
        info = {"stages": dict(getattr(self.stage, "stage_seconds", {}))}  # the model's own stage split
        return Outcome("ok", "", time.perf_counter() - clock, started, self.name, info), result
