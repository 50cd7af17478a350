"""Atomic file writes: a reader never sees a half-written file, a crash never leaves one."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(final: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside `final`; rename it over `final` only if the block succeeds."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    os.close(handle)
    temporary = Path(name)
    try:
        yield temporary
        os.replace(temporary, final)
    finally:
        temporary.unlink(missing_ok=True)


def write_text_atomic(final: str | os.PathLike[str], text: str) -> None:
    with atomic_path(final) as temporary:
        temporary.write_text(text, encoding="utf-8")


def write_bytes_atomic(final: str | os.PathLike[str], data: bytes) -> None:
    with atomic_path(final) as temporary:
        temporary.write_bytes(data)
