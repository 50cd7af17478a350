"""A benchmark's --out directory holds only what benchmarks wrote.

Before a benchmark runs, a directory holding files no benchmark wrote (a user's, another
command's) is refused in one line; after it, what it left there is listed in the directory's
ledger `.foldmill-bench` (foldmill.io.atomic), so a rerun with the same --out replaces its own
files, and `throughput --side oss` adds its row beside `--side foldmill`'s. A benchmark stopped by
SIGTERM (a Slurm time limit) lists its files too; one killed outright leaves them unlisted, and its
rerun asks for the directory to be emptied.
"""

from __future__ import annotations

import argparse
import functools
import re
import signal
import threading
from collections.abc import Callable
from pathlib import Path

from foldmill.io.atomic import LEDGER_PREFIX, adopt_earlier, claim, refuse_foreign

COMMAND = "bench"
# The reports benchmarks wrote before the ledger existed: a directory holding one of them, and no
# ledger of any command, is taken as a benchmark's.
EARLIER_REPORT = re.compile(
    r"(forward|moe|msa|score)_bench\.json|parity\.json|planning\.tsv|throughput\.md|crossover_\w+\.json"
)

Handler = Callable[[argparse.Namespace], int]


def writes_only_its_own(handler: Handler) -> Handler:
    """`handler`, run only where its --out directory holds nothing but benchmarks' files."""

    @functools.wraps(handler)
    def run(args: argparse.Namespace) -> int:
        out = getattr(args, "out", None)
        if out is None:
            return handler(args)
        out = Path(out)
        adopt_earlier(out, COMMAND, _is_earlier_output)
        refuse_foreign(out, COMMAND)
        # Where SIGTERM would end the process on the spot, end it through the `finally` below instead.
        stops_on_the_spot = (threading.current_thread() is threading.main_thread()
                             and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)
        if stops_on_the_spot:
            signal.signal(signal.SIGTERM, _exit_on_sigterm)
        try:
            return handler(args)
        finally:
            if stops_on_the_spot:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
            left = [path.name for path in out.iterdir() if not path.name.startswith(".")] if out.is_dir() else []
            if left:
                claim(out, left, COMMAND)

    return run


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _is_earlier_output(out: Path, entries: list[str]) -> bool:
    """Whether `out` holds a benchmark's report and no command's ledger: written before ledgers existed."""
    return (any(EARLIER_REPORT.fullmatch(name) for name in entries)
            and not any(path.name.startswith(LEDGER_PREFIX) for path in out.iterdir()))
