"""Glue for Snakemake `script:` rules: log to the rule's log file, turn user errors into one line."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from foldmill.errors import FoldmillError
from foldmill.runtime import retry


def run_rule(snakemake: Any, main: Callable[[Any], None]) -> None:
    """Run `main(snakemake)` with logging to the rule's log; a FoldmillError fails the rule in one line.

    A FoldmillError is not retryable (runtime/retry.py): it is recorded beside the log, so that
    Snakemake's retry of the job (resource `attempt` > 1) fails at once without more memory.
    """
    log_file = snakemake.log[0] if len(snakemake.log) else None
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        handlers.append(logging.FileHandler(log_file, mode="w"))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", handlers=handlers, force=True)
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
        logging.getLogger("foldmill").error("%s", error)
        raise SystemExit(f"foldmill: error: {error}") from None
