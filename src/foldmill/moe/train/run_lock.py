"""One trainer per run directory: a second `foldmill pretrain train` started on a run that is training
stops in one line instead of racing the first one's checkpoint renames.

The main process holds an flock on RUN/.foldmill-pretrain.lock while it trains. The kernel drops it when
the process ends, so a killed job leaves no lock behind. Every rank learns the outcome before the first
collective of the run, so no rank is left waiting for one that stopped.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import torch

from foldmill.errors import FoldmillError
from foldmill.moe.train.distributed import Dist, all_reduce_sum

log = logging.getLogger(__name__)

LOCK_FILE = ".foldmill-pretrain.lock"


class RunInUseError(FoldmillError):
    pass


def _take_lock(path: Path) -> tuple[TextIO | None, OSError | None]:
    """(the open, locked lock file, None); (None, None) if another process holds it. On a file system
    without flock (some Lustre mounts): the file unlocked and flock's error, so the run trains
    unlocked rather than every run being refused (the trainer says so, once)."""
    handle = open(path, "a", encoding="utf-8")  # held open, and locked, for the whole run
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None, None
    except OSError as error:
        return handle, error
    return handle, None


def _in_use(run_dir: Path) -> RunInUseError:
    return RunInUseError(f"{run_dir}: another `foldmill pretrain train` is training this run "
                         f"(it holds {LOCK_FILE}); wait for it to finish or stop it")


@contextlib.contextmanager
def exclusive_run(run_dir: Path, env: Dist) -> Iterator[None]:
    """Hold the run directory's lock for the block, or raise RunInUseError on every rank."""
    handle, unlockable = _take_lock(run_dir / LOCK_FILE) if env.is_main else (None, None)
    if unlockable is not None:
        log.warning("%s: cannot lock (%s); training without a lock on the run directory",
                    run_dir / LOCK_FILE, unlockable)
    free = torch.ones(1, device=env.device)
    if env.is_main and handle is None:
        free.zero_()
    try:
        if all_reduce_sum(free).item() < env.world_size:
            raise _in_use(run_dir)
        yield
    finally:
        if handle is not None:
            handle.close()


def refuse_if_training(run_dir: str | Path) -> None:
    """Before building a model or starting workers: stop in one line if a trainer holds the run, rather
    than after the model has taken GPU memory the running trainer may need, or torchrun has started
    every worker and reported each one's failure. The trainer itself still takes the lock."""
    path = Path(run_dir) / LOCK_FILE
    if path.is_file():
        handle, _ = _take_lock(path)
        if handle is None:
            raise _in_use(Path(run_dir))
        handle.close()
