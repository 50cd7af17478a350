"""`foldmill doctor`: print what this machine offers (CUDA, GPU, kernels, Ray, Slurm)."""

from __future__ import annotations

import argparse

from foldmill.cli import command_help
from foldmill.runtime.doctor import environment_report


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("doctor", help=command_help(__doc__))
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    rows = environment_report()
    width = max(len(name) for name, _ in rows)
    for name, finding in rows:
        print(f"{name:<{width}}  {finding}")
    return 0
