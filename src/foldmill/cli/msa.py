"""`foldmill msa`: stage MSAs (parse, check, cache, batched MMseqs2 search)."""

from __future__ import annotations

import argparse
from pathlib import Path

from foldmill.cli import command_help
from foldmill.msa.parse import DEFAULT_MAX_DEPTH, read_msa
from foldmill.msa.staging import MODES, MSAStagingConfig, stage_msas


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("msa", help=command_help(__doc__))
    commands = parser.add_subparsers(dest="msa_command", required=True, metavar="COMMAND")

    stage = commands.add_parser(
        "stage",
        help="stage one MSA per chain of a worklist's unique_chains.tsv",
        description="Write DIR/msa_manifest.tsv and DIR/msa_rejects.tsv (same as the stage_msas rule).",
    )
    stage.add_argument("chains", help="unique_chains.tsv written by `foldmill worklist`")
    stage.add_argument("-o", "--outdir", required=True, help="output directory")
    stage.add_argument("--worklist", help="worklist.tsv: pairs complexes and names the targets of rejected chains")
    stage.add_argument("--mode", choices=MODES, default="auto", help="what proteins without an MSA get (default: auto)")
    stage.add_argument("--database", default="", help="FASTA or MMseqs2 database to search")
    stage.add_argument("--max-depth", type=int, default=DEFAULT_MAX_DEPTH, help="rows kept per MSA")
    stage.add_argument("--cache-dir", default="", help="staged-MSA cache (default: DIR/cache/msa)")
    stage.add_argument("--threads", type=int, default=1, help="MMseqs2 threads")
    stage.add_argument("--sensitivity", type=float, default=7.5, help="MMseqs2 -s")
    stage.add_argument("--evalue", type=float, default=0.1, help="MMseqs2 -e")
    stage.set_defaults(handler=run_stage)

    show = commands.add_parser("show", help="parse one MSA (A3M, Boltz CSV, Stockholm) and print its summary")
    show.add_argument("path", help="MSA file")
    show.add_argument("--sequence", help="check the MSA's query against this chain sequence")
    show.add_argument("--max-depth", type=int, default=DEFAULT_MAX_DEPTH, help="rows kept")
    show.set_defaults(handler=run_show)


def run_stage(args: argparse.Namespace) -> int:
    config = MSAStagingConfig.from_config(
        {"mode": args.mode, "database": args.database, "max_depth": args.max_depth,
         "sensitivity": args.sensitivity, "evalue": args.evalue, "threads": args.threads},
        cache_dir=args.cache_dir,
    )  # fmt: skip
    outdir = Path(args.outdir)
    result = stage_msas(args.chains, outdir / "msa_manifest.tsv", config, args.worklist, outdir / "msa_rejects.tsv")
    counts = result.manifest["source"].value_counts().to_dict()
    print(
        f"{len(result.manifest)} MSAs staged ({', '.join(f'{n} {s}' for s, n in sorted(counts.items())) or 'none'}; "
        f"{result.searched} searched), {len(result.rejects)} rejected in {result.seconds:.1f} s "
        f"({len(result.manifest) / max(result.seconds, 1e-9):.1f} MSAs/s) -> {outdir}"
    )
    return 0


def run_show(args: argparse.Namespace) -> int:
    msa = read_msa(args.path, args.sequence, args.max_depth)
    keyed = int((msa.keys != "").sum())
    print(f"{args.path}: depth {msa.depth}, length {msa.length}, {keyed} rows with a pairing key, "
          f"{int((msa.deletions > 0).sum())} insertion sites")  # fmt: skip
    print(f"query: {msa.query}")
    return 0
