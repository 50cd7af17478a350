"""`foldmill bench NAME`: benchmarks, each a module of foldmill.bench with `register(subparsers)`."""

from __future__ import annotations

import argparse

from foldmill.cli import register_modules


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("bench", help="run a benchmark (ratios against the baseline in the same run)")
    benches = parser.add_subparsers(dest="bench", required=True, metavar="BENCHMARK")
    register_modules("foldmill.bench", benches)
