"""`foldmill filter`: split a run summary into passed/failed targets by confidence thresholds."""

from __future__ import annotations

import argparse
from pathlib import Path

from foldmill.cli import command_help
from foldmill.config import load_config, resolve_config
from foldmill.errors import FoldmillError
from foldmill.io.atomic import refuse_foreign
from foldmill.outputs.filters import (
    COMMAND,
    FilterConfig,
    apply_filters,
    write_filter_tables,
)
from foldmill.outputs.summary import read_summary


def add_threshold_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", help="a foldmill config file; its `filters:` section gives the thresholds (default: the workflow's)"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="TYPE.KEY=VALUE",
        help="set one threshold, e.g. complex.min_iptm=0.7 or monomer.min_plddt=null (repeatable)",
    )


def thresholds_from_args(args: argparse.Namespace) -> FilterConfig:
    """Thresholds from --config's `filters:` section (the schema's defaults where it sets none, as in the
    workflow), then each --set; a threshold set to null is not applied."""
    config = load_config(args.config, require=False) if args.config else resolve_config({}, require=False)
    section = {key: dict(value) for key, value in config["filters"].items()}
    for item in args.set:
        key, _, value = item.partition("=")
        target_type, _, name = key.partition(".")
        if not name or not value:
            raise FoldmillError(f"--set {item!r}: expected TYPE.KEY=VALUE, e.g. complex.min_iptm=0.7")
        try:
            section.setdefault(target_type, {})[name] = None if value == "null" else float(value)
        except ValueError:
            raise FoldmillError(f"--set {item!r}: {value!r} is not a number or null") from None
    unknown = sorted(set(section) - {"monomer", "complex"})
    if unknown:
        raise FoldmillError(f"unknown target type {unknown[0]!r} in thresholds (use monomer or complex)")
    return FilterConfig.from_config(section)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "filter",
        help=command_help(__doc__),
        description="Write DIR/passed.tsv and DIR/failed.tsv with the reason per target (same as the filter rule, "
        "with the workflow's default thresholds unless --config or --set change them). DIR must be new, empty "
        "or an earlier filter's output.",
    )
    parser.add_argument("summary", help="summary.tsv or summary.parquet written by `foldmill summary`")
    parser.add_argument("-o", "--outdir", required=True, help="output directory (new, empty or an earlier filter's)")
    add_threshold_arguments(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    outdir = Path(args.outdir)
    refuse_foreign(outdir, COMMAND)
    result = apply_filters(read_summary(args.summary), thresholds_from_args(args))
    write_filter_tables(result, outdir / "passed.tsv", outdir / "failed.tsv")
    print(f"{int(result['passed'].sum())} of {len(result)} targets passed -> {outdir}")
    return 0
