"""The `foldmill` command.

Each subcommand lives in its own module in this package and exposes
`register(subparsers) -> None`, which adds its parser and sets `handler` (a function taking the
parsed namespace and returning an exit code). Modules are found automatically, so adding a
subcommand means adding one file. A `FoldmillError` is printed as one line, exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys
from collections.abc import Sequence

from foldmill import __version__
from foldmill.errors import FoldmillError


def register_modules(package: str, subparsers: argparse._SubParsersAction) -> None:
    """Import every module of `package` and let it register its subcommand."""
    module = importlib.import_module(package)
    for info in sorted(pkgutil.iter_modules(module.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        importlib.import_module(f"{package}.{info.name}").register(subparsers)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="foldmill", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"foldmill {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    register_modules("foldmill.cli", subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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
