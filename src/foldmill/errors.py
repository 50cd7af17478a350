"""User-facing errors.

Every error a user can cause (bad input, bad config, missing file) is raised as a
`FoldmillError`; the CLI prints it as one line and exits 2, never a traceback.
"""

from __future__ import annotations


class FoldmillError(Exception):
    """An error whose message is shown to the user as is."""


class InputError(FoldmillError):
    """A problem with one input record: names the file, the record and what is wrong."""

    def __init__(self, source: str, record: str | None, problem: str) -> None:
        self.source = str(source)
        self.record = record
        self.problem = problem
        where = f"{self.source}: {record}" if record else self.source
        super().__init__(f"{where}: {problem}")


class CheckpointError(FoldmillError):
    """A checkpoint that cannot be loaded (wrong keys, unsafe payload, unreadable)."""


def one_line(error: BaseException) -> str:
    """`error` for a one-line message: its type and the first line of its text."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


def import_failure(module: str) -> str | None:
    """Why an installed `module` fails to import, in one line, or None where it imports: a module
    it needs missing or of another version, or a native library failing to load."""
    import importlib

    try:
        importlib.import_module(module)
    except (ImportError, OSError, RuntimeError) as error:
        return one_line(error)
    return None


def is_out_of_memory(error: BaseException) -> bool:
    """A GPU or host allocation that failed (torch's CUDA errors, its CPU allocator's, Python's)."""
    import torch

    if isinstance(error, torch.OutOfMemoryError | MemoryError):
        return True
    message = str(error).lower()
    return isinstance(error, RuntimeError) and ("out of memory" in message or "can't allocate memory" in message)
