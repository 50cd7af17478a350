"""`foldmill templates`: stage template alignments; build a seqres FASTA."""

from __future__ import annotations

import argparse
from pathlib import Path

from foldmill.cli import command_help
from foldmill.templates.search import structure_files, write_seqres
from foldmill.templates.staging import TemplateStagingConfig, stage_templates


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("templates", help=command_help(__doc__))
    commands = parser.add_subparsers(dest="templates_command", required=True, metavar="COMMAND")

    stage = commands.add_parser(
        "stage",
        help="align user templates and (optionally) search templates for a worklist",
        description="Write DIR/templates_manifest.tsv and DIR/templates_rejects.tsv "
        "(same as the stage_templates rule).",
    )
    stage.add_argument("worklist", help="worklist.tsv written by `foldmill worklist`")
    stage.add_argument("-o", "--outdir", required=True, help="output directory")
    stage.add_argument("--seqres", default="", help="seqres FASTA to search (ids <structure>_<chain>)")
    stage.add_argument("--mmcif-dir", default="", help="directory of the structures named in --seqres")
    stage.add_argument("--max-release-date", default="", help="YYYY-MM-DD: only templates released by then")
    stage.add_argument("--top-k", type=int, default=4, help="searched templates per chain")
    stage.add_argument("--cache-dir", default="", help="searched-template cache (default: DIR/cache/templates)")
    stage.add_argument("--threads", type=int, default=1, help="MMseqs2 threads")
    stage.set_defaults(handler=run_stage)

    seqres = commands.add_parser("seqres", help="write the protein chain sequences of a structure directory as FASTA")
    seqres.add_argument("directory", help="directory of mmCIF/PDB files")
    seqres.add_argument("-o", "--output", required=True, help="FASTA to write")
    seqres.set_defaults(handler=run_seqres)


def run_stage(args: argparse.Namespace) -> int:
    section = {"seqres": args.seqres, "mmcif_dir": args.mmcif_dir, "max_release_date": args.max_release_date,
               "top_k": args.top_k, "threads": args.threads}  # fmt: skip
    config = TemplateStagingConfig.from_config(section, cache_dir=args.cache_dir)
    outdir = Path(args.outdir)
    result = stage_templates(args.worklist, outdir / "templates_manifest.tsv", config, outdir / "templates_rejects.tsv")
    print(f"{len(result.manifest)} template alignments ({result.searched} chains searched), "
          f"{len(result.rejects)} targets rejected -> {outdir}")  # fmt: skip
    return 0


def run_seqres(args: argparse.Namespace) -> int:
    count = write_seqres(structure_files(args.directory), args.output)
    print(f"{count} protein chains -> {args.output}")
    return 0
