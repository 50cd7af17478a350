"""Run one benchmark module without the full CLI (whose other commands import Ray, Biopython, ...):

    python -m foldmill.bench.forward --inputs 150 ...   # same arguments as `foldmill bench forward`

For bare GPU nodes that hold only what the benchmark needs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from foldmill.errors import FoldmillError


def main(register: Callable[[argparse._SubParsersAction], None], argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="foldmill bench")
    register(parser.add_subparsers(dest="bench", required=True))
    argv = sys.argv[1:] if argv is None else argv
    names = list(parser._subparsers._group_actions[0].choices)  # the one registered name
    args = parser.parse_args([names[0], *argv])
    try:
        return args.handler(args)
    except FoldmillError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
