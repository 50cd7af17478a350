"""Glue for Snakemake `script:` rules: log to the rule's log file, turn user errors into one line."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from foldmill.errors import FoldmillError


def run_rule(snakemake: Any, main: Callable[[Any], None]) -> None:
    """Run `main(snakemake)` with logging to the rule's log; a FoldmillError fails the rule in one line."""
    log_file = snakemake.log[0] if len(snakemake.log) else None
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        handlers.append(logging.FileHandler(log_file, mode="w"))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", handlers=handlers, force=True)
    try:
        main(snakemake)
    except FoldmillError as error:
        # Into the log file; the console gets it once, from SystemExit.
        logging.getLogger().removeHandler(handlers[0])
        logging.getLogger("foldmill").error("%s", error)
        raise SystemExit(f"foldmill: error: {error}") from None
