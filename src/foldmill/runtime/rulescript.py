"""Glue for Snakemake `script:` rules: log to the rule's log file, turn user errors and interrupts into one line."""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Callable
from typing import Any

from foldmill.errors import FoldmillError
from foldmill.runtime import retry


def run_rule(snakemake: Any, main: Callable[[Any], None]) -> None:
    """Run `main(snakemake)` with logging to the rule's log; a FoldmillError fails the rule in one line.

    SIGTERM (Snakemake stopping its jobs, Slurm's time limit) is handled like Ctrl-C: a KeyboardInterrupt,
    so the `finally` blocks of `main` clean up, then one line and the exit status of that signal.
    A FoldmillError is not retryable (runtime/retry.py): it is recorded beside the log, so that
    Snakemake's retry of the job (resource `attempt` > 1) fails at once without more memory.
    """
    log_file = snakemake.log[0] if len(snakemake.log) else None
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        handlers.append(logging.FileHandler(log_file, mode="w"))
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", handlers=handlers, force=True
    )
    signal.signal(signal.SIGTERM, _terminated)
    attempt = getattr(snakemake.resources, "attempt", 1)
    try:
        if log_file:
            retry.fail_if_recorded(log_file, attempt)
        try:
            main(snakemake)
        except FoldmillError as error:
            if log_file:
                retry.record(log_file, str(error))
            raise
    except FoldmillError as error:
        # Into the log file; the console gets it once, from SystemExit.
        logging.getLogger().removeHandler(handlers[0])
        logging.getLogger("foldmill").error("%s", error)
        raise SystemExit(f"foldmill: error: {error}") from None
    except KeyboardInterrupt as interrupt:
        # foldmill.executor's FoldInterrupted says what was kept; a bare KeyboardInterrupt says nothing.
        logging.getLogger("foldmill").warning("%s", interrupt if str(interrupt) else "interrupted; rerun to resume")
        raise SystemExit(getattr(interrupt, "exit_code", 128 + signal.SIGINT)) from None


class Terminated(KeyboardInterrupt):
    exit_code = 128 + signal.SIGTERM


def _terminated(signum: int, frame: Any) -> None:
    raise Terminated("interrupted (SIGTERM); rerun to resume")
