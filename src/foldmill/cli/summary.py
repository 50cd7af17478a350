"""`foldmill summary`: summarize a run: status, composition and confidences per target."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from foldmill.cli import command_help
from foldmill.io.atomic import refuse_foreign
from foldmill.outputs.summary import RunRecords, build_summary, summary_notes, write_summary


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "summary",
        help=command_help(__doc__),
        description="Read the per-shard fold tables and the worklist and write DIR/summary.tsv and "
        "DIR/summary.parquet (same as the summary rule); DIR must be new, empty or an earlier summary's output. "
        "The worklist's rejects.tsv and the run's staged/ manifests beside it, when present, add the refused "
        "targets and the MSA columns.",
    )
    parser.add_argument("fold_tables", nargs="+", help="fold tables (OUTDIR/fold/shard_*.tsv)")
    parser.add_argument("--worklist", required=True, help="worklist.tsv written by `foldmill worklist`")
    parser.add_argument("-o", "--outdir", required=True, help="output directory (new, empty or an earlier summary's)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    outdir = Path(args.outdir)
    refuse_foreign(outdir, "summary")  # before the (long) reading, not only at the write
    table = build_summary(args.fold_tables, args.worklist, RunRecords.beside(args.worklist))
    write_summary(table, outdir / "summary.tsv", outdir / "summary.parquet")
    counts, warnings = summary_notes(table)
    print(f"{counts} -> {outdir}")
    for warning in warnings:
        print(f"foldmill: warning: {warning}", file=sys.stderr)
    return 0
