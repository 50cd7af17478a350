"""Stop a fold run cleanly on Ctrl-C (SIGINT) or SIGTERM (Slurm's time limit, scancel, Snakemake).

While a run folds, both signals only ask it to stop: the scheduler hands out no new work at its
next turn (within a second), the actors and a local Ray instance are shut down, and the run
raises `FoldInterrupted`, which callers turn into one line. Before the scheduler runs (Ray and the
actors starting), the signal raises `FoldInterrupted` at once, unwinding through the same clean-up.
Finished targets are on disk with their done markers and in the journal, so a rerun folds only
the rest; a target cut off mid-write never got its done marker and is folded again.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class FoldInterrupted(KeyboardInterrupt):
    """The run stopped on a signal. A KeyboardInterrupt, so no `except Exception` on the way swallows it."""

    def __init__(self, signum: int, done: int = 0, total: int = 0) -> None:
        self.signum, self.done, self.total = signum, done, total
        super().__init__(self.message)

    @property
    def message(self) -> str:
        name = signal.Signals(self.signum).name
        return f"fold: interrupted ({name}); rerun to resume ({self.done} of {self.total} targets done)"

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # what a shell reports for a process ended by that signal


class StopRequest:
    """Set by the signal handler; `deferred` while the scheduler loop polls it (no exception mid-bookkeeping)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.deferred = False

    def __bool__(self) -> bool:
        return self.signum is not None

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:  # a second Ctrl-C while stopping: the clean-up is already on its way
            return
        self.signum = signum  # said once, by the caller, when the run has stopped (FoldInterrupted)
        if not self.deferred:
            raise FoldInterrupted(signum)

    def install(self) -> None:
        """(Re)install the handlers: connecting to Ray replaces SIGTERM's with one that aborts the process."""
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                signal.signal(signum, self.handle)


@contextmanager
def stop_on_signals() -> Iterator[StopRequest]:
    """SIGINT and SIGTERM stop the run for the duration of the block (main thread only: elsewhere
    Python cannot install handlers, and the embedding program keeps its own)."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    request.install()
    try:
        yield request
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
