"""`foldmill worklist`: build a validated worklist from proteome FASTA, target sheets or Boltz YAML files."""

from __future__ import annotations

import argparse

from foldmill.cli import command_help
from foldmill.config import defaults
from foldmill.io.worklist import build_worklist, write_worklist


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "worklist",
        help=command_help(__doc__),
        description="Read proteome FASTA files, target sheets (TSV/CSV) and Boltz YAML/FASTA inputs "
        "(files or directories) and write DIR/worklist.tsv, DIR/worklist.parquet and DIR/unique_chains.tsv.",
    )
    parser.add_argument("inputs", nargs="+", help="input files or directories")
    parser.add_argument("-o", "--outdir", required=True, help="output directory")
    parser.add_argument(
        "--skip-bad", action="store_true", help="write bad targets to DIR/rejects.tsv and go on instead of stopping"
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=defaults("worklist")["max_tokens"],
        help="reject targets larger than this many tokens (default: %(default)s, what one H200 folds)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    result = build_worklist(args.inputs, skip_bad=args.skip_bad, max_tokens=args.max_tokens)
    write_worklist(result, args.outdir, write_rejects=args.skip_bad)
    tokens = int(result.table["n_tokens"].sum()) if len(result.table) else 0
    print(f"{len(result.table)} targets ({tokens} tokens), {len(result.rejects)} rejected -> {args.outdir}")
    return 0
