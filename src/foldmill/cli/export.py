"""`foldmill export`: export the targets that passed the confidence filters."""

from __future__ import annotations

import argparse
from pathlib import Path

from foldmill.cli import command_help
from foldmill.cli.filter import add_threshold_arguments, thresholds_from_args
from foldmill.io.atomic import refuse_foreign
from foldmill.outputs.export import COMMAND, ExportOptions, archive_export, export_passing
from foldmill.outputs.filters import read_filter_result


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "export",
        help=command_help(__doc__),
        description="Copy the passing targets of FILTER_DIR (passed.tsv, failed.tsv from `foldmill filter`) "
        "into DIR with summary.tsv, README.md and a sha256 manifest.tsv (same as the export rule). "
        "Give the thresholds the filter used, so the README states them. DIR must be new, empty or an earlier "
        "export, which is replaced as a whole; anything else is refused.",
    )
    parser.add_argument("filter_dir", help="directory with passed.tsv and failed.tsv")
    parser.add_argument("-o", "--outdir", required=True, help="export directory (new, empty or an earlier export)")
    parser.add_argument("--top-k", type=int, default=1, help="ranked models per target (default: 1, the best)")
    parser.add_argument("--include-arrays", action="store_true", help="also copy the pLDDT/PAE/PDE .npz arrays")
    parser.add_argument("--tar-gz", action="store_true", help="also write DIR.tar.gz (new or an earlier export's)")
    add_threshold_arguments(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    filter_dir = Path(args.filter_dir)
    outdir = Path(args.outdir)
    archive = outdir.with_name(outdir.name + ".tar.gz")
    # Both destinations are checked before anything is written, so a refusal leaves no half export.
    refuse_foreign(outdir, COMMAND)
    if args.tar_gz:
        refuse_foreign(archive.parent, COMMAND, [archive.name])
    result = read_filter_result(filter_dir / "passed.tsv", filter_dir / "failed.tsv")
    options = ExportOptions(top_k=max(1, args.top_k), include_arrays=args.include_arrays)
    count = export_passing(result, outdir, thresholds_from_args(args), options)
    if args.tar_gz:
        archive_export(outdir, archive)
    print(f"{count} targets exported -> {outdir}")
    return 0
