"""In the Snakemake process: Ctrl-C or SIGTERM to Snakemake alone also stops its running jobs.

Snakemake's local executor waits for running jobs on SIGINT and SIGTERM (SIGTERM asks it to finish
gracefully), so `kill -INT <snakemake>` left a fold job running to its end. The workflow installs
`forward_stop_signals_to_jobs` at start: on either signal the jobs' processes get SIGTERM, which
foldmill's rule scripts handle as an interrupt (clean-up, one line), and Snakemake's own handling
follows. Ctrl-C in a terminal reaches the jobs anyway (one process group); the second signal is a no-op.
"""

from __future__ import annotations

import os
import signal
from types import FrameType
from typing import Any

import psutil

SHELLS = {"bash", "sh", "dash", "zsh"}


def forward_stop_signals_to_jobs() -> None:
    """Chain a handler for SIGINT and SIGTERM in front of the ones installed now (Snakemake's)."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _forwarding(signal.getsignal(signum)))


def _forwarding(previous: Any) -> Any:
    def handler(signum: int, frame: FrameType | None) -> None:
        terminate_jobs()
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    return handler


def terminate_jobs() -> None:
    """SIGTERM to each job process of this one: a job's command itself, not the shell Snakemake ran it in
    (a shell that does not exec its last command would die and leave the command running)."""
    for child in psutil.Process().children():
        try:
            targets = child.children() if child.name() in SHELLS else [child]
            for process in targets:
                process.send_signal(signal.SIGTERM)
        except psutil.Error:  # gone meanwhile
            continue
