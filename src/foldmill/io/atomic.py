"""Atomic writes, and the files a command owns in a directory.

Atomic: a reader never sees a half-written file or directory; a crash never leaves one in place.
Written files get mode 0666 less the process umask (0644 under the usual 022), as `open()` gives,
so outputs on a shared filesystem stay readable by the group (tempfile.mkstemp would give 0600).

Ownership: an output command (summary, filter, export, report) lists the files it wrote in a
directory in that directory's ledger `.foldmill-<command>`, one relative path a line. It writes
only where that keeps every other file safe, and refuses in one line naming an example otherwise:
- a directory it fills (`exclusive`, and every directory it replaces as a whole) must be new,
  empty, or hold nothing but files its ledger lists;
- writing beside other files (the summary in a run's outdir), each file it writes must be new or
  listed in its ledger.
So a rerun replaces the command's own earlier output and nothing else. The ledger is written
before the files are renamed into place: an interrupted write leaves nothing unlisted behind.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from foldmill.errors import FoldmillError

LEDGER_PREFIX = ".foldmill-"
# Our temporary names (`.<name>.<32 hex>.tmp|old`): leftovers of an interrupted write, never a user's file.
_TEMPORARY = re.compile(r"^\..+\.[0-9a-f]{32}\.(tmp|old)$")


class ForeignFilesError(FoldmillError):
    """The output directory holds files the command did not write; nothing was written."""


def _temporary_name(final: Path, kind: str = "tmp") -> Path:
    return final.parent / f".{final.name}.{uuid.uuid4().hex}.{kind}"


def _create_file(path: Path) -> None:
    """An empty new file with mode 0666 less the umask (what `open(path, "w")` would give)."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))


@contextmanager
def atomic_path(final: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside `final`; rename it over `final` only if the block succeeds."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    temporary = _temporary_name(final)
    _create_file(temporary)
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


@contextmanager
def atomic_directory(final: str | os.PathLike[str]) -> Iterator[Path]:
    """A fresh directory beside `final`, renamed over it if the block succeeds, removed otherwise.

    A reader sees either the old complete directory or the new complete one; an existing
    `final` (a retry, a re-export) is replaced.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    # mkdir (not mkdtemp) so the directory gets the user's umask, not mode 0700.
    staging = _temporary_name(final)
    staging.mkdir()
    try:
        yield staging
        if final.exists():
            # A directory cannot be renamed over a non-empty one: move the old one aside first.
            previous = _temporary_name(final, "old")
            os.replace(final, previous)
            os.replace(staging, final)
            shutil.rmtree(previous, ignore_errors=True)
        else:
            os.replace(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


# --- ownership -------------------------------------------------------------------------------


def ledger_path(directory: str | os.PathLike[str], command: str) -> Path:
    return Path(directory) / f"{LEDGER_PREFIX}{command}"


def read_ledger(directory: str | os.PathLike[str], command: str) -> set[str]:
    """Relative paths the command recorded writing in `directory` (empty when it never did)."""
    try:
        text = ledger_path(directory, command).read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return set()
    return {line for line in text.splitlines() if line and not line.startswith("#")}


def _write_ledger(directory: Path, command: str, names: Iterable[str]) -> None:
    header = f"# files written here by foldmill {command}; a rerun replaces only these\n"
    write_text_atomic(ledger_path(directory, command), header + "".join(f"{name}\n" for name in sorted(names)))


def claim(directory: str | os.PathLike[str], names: Iterable[str], command: str) -> None:
    """List `names` (files or whole folders) in the command's ledger of `directory`, beside what it
    already lists, creating the directory if needed: for commands that write there over time."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    _write_ledger(directory, command, read_ledger(directory, command) | set(names))


def adopt_earlier(directory: str | os.PathLike[str], command: str,
                  written_by_it: Callable[[Path, list[str]], bool], names: Sequence[str] | None = None) -> None:
    """List in the command's ledger what it wrote in `directory` before it kept one, so that a rerun
    may replace it: the visible entries (those among `names`, where given) of a directory that has
    no ledger of this command, when `written_by_it(directory, entries)` knows them as its output."""
    directory = Path(directory)
    if not directory.is_dir() or read_ledger(directory, command):
        return
    entries = sorted(path.name for path in directory.iterdir() if not path.name.startswith("."))
    if names is not None:
        entries = [name for name in entries if name in names]
    if entries and written_by_it(directory, entries):
        claim(directory, entries, command)


def foreign_files(directory: str | os.PathLike[str], command: str, names: Sequence[str] | None = None) -> list[Path]:
    """What in `directory` the command's ledger does not list: among `names`, or anywhere (names None)."""
    directory = Path(directory)
    if not directory.is_dir():
        return [directory] if directory.exists() else []
    listed = read_ledger(directory, command)
    if names is not None:
        return [directory / name for name in names if name not in listed and os.path.lexists(directory / name)]
    listed_dirs = {parent.as_posix() for name in listed for parent in Path(name).parents}
    ours = {ledger_path(directory, command).name}
    found = []
    for root, dirnames, filenames in os.walk(directory):
        relative = Path(root).relative_to(directory)
        for name in sorted(filenames):
            path = (relative / name).as_posix()
            if path not in listed and not (root == str(directory) and name in ours) and not _TEMPORARY.match(name):
                found.append(directory / path)
        for name in sorted(dirnames):
            path = (relative / name).as_posix()
            if path not in listed_dirs and path not in listed and not _TEMPORARY.match(name):
                found.append(directory / path)
        dirnames[:] = [name for name in dirnames if (relative / name).as_posix() in listed_dirs]
    return found


def refuse_foreign(directory: str | os.PathLike[str], command: str, names: Sequence[str] | None = None) -> None:
    """Raise ForeignFilesError (one line) when `directory` holds files the command must not replace."""
    found = foreign_files(directory, command, names)
    if not found:
        return
    directory = Path(directory)
    # A visible file makes the better example than a hidden one (another command's ledger).
    found.sort(key=lambda path: any(part.startswith(".") for part in path.relative_to(directory).parts))
    if found == [directory]:
        raise ForeignFilesError(f"{directory}: exists and is not a directory; foldmill {command} wrote nothing")
    more = f" and {len(found) - 1} more" if len(found) > 1 else ""
    remedy = "give a new or empty directory" if names is None else "move it, or give another path"
    raise ForeignFilesError(
        f"{directory}: holds files foldmill {command} did not write (e.g. {found[0].relative_to(directory)}{more}); "
        f"nothing was written: {remedy}"
    )


@contextmanager
def owned_files(
    paths: Sequence[str | os.PathLike[str]], command: str, exclusive: bool = True
) -> Iterator[list[Path]]:
    """Temporary paths for `paths` (files of one directory), renamed over them when the block succeeds.

    Refused before anything is written when the directory holds files the command did not write
    (exclusive), or when one of `paths` exists and was not written by it (not exclusive).
    """
    finals = [Path(path) for path in paths]
    directory = finals[0].parent
    if any(final.parent != directory for final in finals):
        raise ValueError(f"owned_files: {finals} are not in one directory")
    names = [final.name for final in finals]
    refuse_foreign(directory, command, None if exclusive else names)
    directory.mkdir(parents=True, exist_ok=True)
    temporaries = []
    try:
        for final in finals:
            temporaries.append(_temporary_name(final))
            _create_file(temporaries[-1])
        yield temporaries
        still_there = {name for name in read_ledger(directory, command) if os.path.lexists(directory / name)}
        _write_ledger(directory, command, still_there | set(names))
        for temporary, final in zip(temporaries, finals):
            os.replace(temporary, final)
    finally:
        for temporary in temporaries:
            temporary.unlink(missing_ok=True)


@contextmanager
def owned_directory(final: str | os.PathLike[str], command: str) -> Iterator[Path]:
    """A staging directory that replaces `final` as a whole (atomic_directory) when the block succeeds.

    Refused before anything is written when `final` holds files the command did not write; what
    the staging directory holds (files and folders) becomes the new ledger.
    """
    final = Path(final)
    refuse_foreign(final, command)
    with atomic_directory(final) as staging:
        yield staging
        _write_ledger(staging, command, [p.relative_to(staging).as_posix() for p in staging.rglob("*")])
        refuse_foreign(final, command)  # checked again: nothing may have appeared there meanwhile
