"""`foldmill report`: write the run report (one self-contained HTML page) from the filter tables."""

from __future__ import annotations

import argparse
from pathlib import Path

from foldmill.cli import command_help
from foldmill.cli.filter import add_threshold_arguments, thresholds_from_args
from foldmill.io.atomic import refuse_foreign
from foldmill.outputs.filters import read_filter_result
from foldmill.outputs.report import COMMAND, write_report


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "report",
        help=command_help(__doc__),
        description="Write DIR/report.html from FILTER_DIR (passed.tsv, failed.tsv from `foldmill filter`), "
        "as the report rule does. Give the thresholds the filter used, so the report states them. "
        "DIR must be new, empty or an earlier report's.",
    )
    parser.add_argument("filter_dir", help="directory with passed.tsv and failed.tsv")
    parser.add_argument("-o", "--outdir", required=True, help="output directory (new, empty or an earlier report's)")
    add_threshold_arguments(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    outdir = Path(args.outdir)
    refuse_foreign(outdir, COMMAND)
    filter_dir = Path(args.filter_dir)
    result = read_filter_result(filter_dir / "passed.tsv", filter_dir / "failed.tsv")
    write_report(result, thresholds_from_args(args), outdir / "report.html")
    print(f"report of {len(result)} targets -> {outdir / 'report.html'}")
    return 0
