"""Whole directories written all or nothing: assembled under a temporary name, renamed into place."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def staging_directory(final: Path) -> Iterator[Path]:
    """A fresh directory beside `final`, renamed over it if the block succeeds, removed otherwise.

    A reader sees either the old complete directory or the new complete one; an existing
    `final` (a retry, a re-export) is replaced.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    # mkdir (not mkdtemp) so the directory gets the user's umask, not mode 0700.
    staging = final.parent / f".{final.name}.{uuid.uuid4().hex}.tmp"
    staging.mkdir()
    try:
        yield staging
        if final.exists():
            # A directory cannot be renamed over a non-empty one: move the old one aside first.
            previous = final.parent / f".{final.name}.{uuid.uuid4().hex}.old"
            os.replace(final, previous)
            os.replace(staging, final)
            shutil.rmtree(previous, ignore_errors=True)
        else:
            os.replace(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
