"""The `foldmill` command.

Each subcommand lives in its own module in this package and exposes
`register(subparsers) -> None`, which adds its parser and sets `handler` (a function taking the
parsed namespace and returning an exit code). Modules are found automatically, so adding a
subcommand means adding one file. The first line of a module's docstring, "`foldmill NAME`: HELP.",
is the help `foldmill --help` lists. A `FoldmillError`, like a usage error, is printed as one
line, exit code 2.

Only the subcommand being run is imported: the others are listed from their docstrings, so
`foldmill worklist` or `foldmill --help` does not pay for importing torch.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import logging
import os
import pkgutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from foldmill import __version__
from foldmill.errors import FoldmillError


def command_help(doc: str | None) -> str:
    """A command module's help: its docstring's first line, "`foldmill NAME`: HELP.", less the name."""
    return (doc or "").split("\n", 1)[0].partition("`: ")[2].rstrip(".")


def register_modules(package: str, subparsers: argparse._SubParsersAction, only: str | None = None) -> None:
    """Import the modules of `package` and let each register its subcommand.

    With `only`, just the module of that name is imported; the others are listed with their help
    read from their source, and are never parsed since they were not asked for. A module whose
    dependencies are not installed (a GPU node without gemmi, say) still gets a subcommand, which
    says in one line what is missing; the other subcommands keep working.
    """
    module = importlib.import_module(package)
    for info in sorted(pkgutil.iter_modules(module.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        if only is not None and info.name != only:
            source = Path(importlib.util.find_spec(f"{package}.{info.name}").origin).read_text(encoding="utf-8")
            subparsers.add_parser(info.name, help=command_help(ast.get_docstring(ast.parse(source))))
            continue
        try:
            command = importlib.import_module(f"{package}.{info.name}")
        except ModuleNotFoundError as error:
            _register_unavailable(subparsers, info.name, error.name or str(error))
            continue
        command.register(subparsers)


def _register_unavailable(subparsers: argparse._SubParsersAction, name: str, missing: str) -> None:
    parser = subparsers.add_parser(name, help=f"(unavailable: needs the Python package {missing!r})")

    def refuse(args: argparse.Namespace) -> int:
        raise FoldmillError(f"'{name}' needs the Python package {missing!r}, which is not installed")

    # Its real arguments are unknown here, so whatever follows the name is accepted and ignored.
    parser.set_defaults(handler=refuse, accepts_any_arguments=True)


class CommandParser(argparse.ArgumentParser):
    """argparse's parser, with a usage error in one line that points to --help instead of the usage
    text, which runs to 30 lines for `foldmill pretrain train`. Subcommands' parsers are of this
    class too (add_subparsers makes its parsers of the parent's class)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser for `argv`: only its subcommand is imported. Without `argv`, every subcommand."""
    parser = CommandParser(prog="foldmill", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"foldmill {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    only = None if argv is None else next((arg for arg in argv if not arg.startswith("-")), "")
    register_modules("foldmill.cli", subparsers, only)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args, unknown = parser.parse_known_args(argv)
    if unknown and not getattr(args, "accepts_any_arguments", False):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.handler(args) or 0)
    except FoldmillError as error:
        print(f"foldmill: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("foldmill: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`foldmill doctor | head`): stop quietly, as shell tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
