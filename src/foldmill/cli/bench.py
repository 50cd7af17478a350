"""`foldmill bench NAME`: run a benchmark (ratios against the baseline in the same run).

Each benchmark is a module of foldmill.bench with `register(subparsers)`.
"""

from __future__ import annotations

import argparse

from foldmill.cli import command_help, register_modules


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("bench", help=command_help(__doc__))
    benches = parser.add_subparsers(dest="bench", required=True, metavar="BENCHMARK")
    register_modules("foldmill.bench", benches)
