"""Which failed jobs are worth a retry.

A job that ran out of memory or time, lost its node or was preempted may well succeed when
resubmitted with more memory and time. A job that failed on a FoldmillError (a bad checkpoint, no
GPU, a bad input) fails the same way every time. Snakemake retries per rule, not per error, so the
job leaves a marker beside its log when its error is of the second kind: its resource functions
then stop growing memory and runtime (`growth`), and a resubmitted attempt fails at once with
the recorded message (`fail_if_recorded`) instead of running again.
"""

from __future__ import annotations

from pathlib import Path

from foldmill.errors import FoldmillError

MARKER_SUFFIX = ".not-retryable"


def marker_path(log_file: str | Path) -> Path:
    log_file = Path(log_file)
    return log_file.with_name(log_file.name + MARKER_SUFFIX)


def record(log_file: str | Path, message: str) -> None:
    """Mark the job whose log is `log_file` as failed on an error a retry cannot fix."""
    path = marker_path(log_file)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(message + "\n")


def recorded(log_file: str | Path) -> str | None:
    """The message of the recorded non-retryable failure, or None."""
    try:
        return marker_path(log_file).read_text().strip() or None
    except OSError:
        return None


def clear(log_file: str | Path) -> None:
    marker_path(log_file).unlink(missing_ok=True)


def growth(log_file: str | Path, attempt: int) -> int:
    """The factor a job's memory and runtime grow by at `attempt`: the attempt itself, unless the
    last failure was not retryable (then 1: more memory would not help)."""
    return 1 if attempt > 1 and recorded(log_file) else max(1, attempt)


def fail_if_recorded(log_file: str | Path, attempt: int) -> None:
    """On a retry after a non-retryable failure, fail at once with its message; on a first attempt,
    forget a marker left by an earlier run (its input may have been fixed since)."""
    if attempt <= 1:
        clear(log_file)
        return
    message = recorded(log_file)
    if message:
        raise FoldmillError(f"{message} (not retried: the same input fails the same way)")
