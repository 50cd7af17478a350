"""`foldmill fold`: fold targets (Boltz YAML/FASTA, proteome FASTA, sheets) into OUTDIR/predictions.

Runs the Ray replica executor outside the workflow. Inputs are what `foldmill worklist` reads
(Boltz YAML/FASTA, proteome FASTA, target sheets) or, with --worklist, a worklist or shard table.
MSAs come from each target's own `msa:` (or the sequence alone) unless --staged names a workflow
run's staged inputs. Settings come from the `model:`, `executor:` and `outputs:` sections of a
workflow config (--config; config/README.md) and the options below, which win. The model is named
explicitly: --model CHECKPOINT, or model.checkpoint in the config; `--model demo` folds with seeded
random weights (a demo, not a prediction, and said so at start). A rerun skips targets already
written.
Exit status: 0 every target folded, 1 some failed or were rejected (see OUTDIR/fold/fold.tsv),
2 unusable input or settings.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from foldmill.cli import command_help
from foldmill.config import load_config, resolve_config
from foldmill.errors import FoldmillError
from foldmill.executor.engine import Staging
from foldmill.executor.interrupts import FoldInterrupted
from foldmill.executor.run import OutputSettings, fold_targets, read_work_items, work_items
from foldmill.executor.settings import DEVICES, ExecutorSettings, ModelSettings, executor_settings, model_settings
from foldmill.io.worklist import build_worklist

# Options that override a field of the recipe, the model settings or the executor settings.
RECIPE_OPTIONS = ("recycling_steps", "sampling_steps", "diffusion_samples", "max_parallel_samples", "seed")
EXECUTOR_OPTIONS = {"ray_address": "address", "cpus": "cpus", "cpu_replicas": "cpu_replicas",
                    "cpu_workers": "cpu_workers", "token_budget": "token_budget"}  # fmt: skip


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "fold",
        help=command_help(__doc__),
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("inputs", nargs="*", help="input files or directories")
    parser.add_argument("-o", "--outdir", required=True, help="output directory (predictions/, fold/fold.tsv)")
    parser.add_argument("--worklist", help="fold the targets of this worklist or shard table instead of INPUTS")
    parser.add_argument("--skip-bad", action="store_true", help="leave out bad input records instead of stopping")
    parser.add_argument("--config", type=Path, help="workflow config whose model:, executor: and outputs: sections to use")
    parser.add_argument("--staged", type=Path, help="use the MSAs and templates a workflow run staged (its OUTDIR/staged)")
    model = parser.add_argument_group("model and recipe (default: the config's, else Boltz-2's)")
    model.add_argument(
        "--model",
        help="checkpoint (boltz2_conf.ckpt) or 'demo' (seeded random weights); required unless --config sets it",
    )
    model.add_argument("--device", choices=("auto", *DEVICES), help="default auto: cuda when available, else cpu")
    for option in RECIPE_OPTIONS:
        model.add_argument(f"--{option.replace('_', '-')}", type=int)
    model.add_argument("--max-msa-seqs", type=int)
    run = parser.add_argument_group("executor")
    run.add_argument("--ray-address", help="join this Ray cluster (default: RAY_ADDRESS, else a local instance)")
    run.add_argument("--cpus", type=int, help="CPUs of the local Ray instance (default: all usable)")
    run.add_argument("--cpu-replicas", type=int, help="model replicas with --device cpu (default 1)")
    run.add_argument("--cpu-workers", type=int, help="featurize actors, and as many writers (default 1)")
    run.add_argument("--token-budget", type=int, help="largest target per replica (default: from device memory)")
    out = parser.add_argument_group("outputs")
    out.add_argument("--top-k", type=int, help="write only the K best samples per target")
    out.add_argument("--pdb", action="store_true", help="write PDB files beside the mmCIF")
    parser.set_defaults(handler=run_fold)


def settings_from(args: argparse.Namespace) -> tuple[ModelSettings, ExecutorSettings, OutputSettings]:
    """The config file's sections (if any), then every option given on the command line."""
    sections = load_config(args.config, require=False) if args.config else resolve_config({}, require=False)
    written = sections["outputs"]
    top_k = args.top_k if args.top_k is not None else written["top_k"]
    outputs = OutputSettings(top_k, args.pdb or written["write_pdb"])
    options = {"checkpoint": args.model, "device": args.device, "max_msa_seqs": args.max_msa_seqs}
    section = {**sections["model"], **{key: value for key, value in options.items() if value is not None}}
    recipe = {name: getattr(args, name) for name in RECIPE_OPTIONS if getattr(args, name) is not None}
    section["recipe"] = {**section["recipe"], **recipe}
    if "checkpoint" not in section:
        raise FoldmillError("no model: give --model CHECKPOINT (boltz2_conf.ckpt), or --model demo for random weights")
    model = model_settings(section)
    executor = executor_settings(sections["executor"])
    given = {
        field: getattr(args, option) for option, field in EXECUTOR_OPTIONS.items() if getattr(args, option) is not None
    }
    return model, replace(executor, **given), outputs


def run_fold(args: argparse.Namespace) -> int:
    if bool(args.inputs) == bool(args.worklist):
        raise FoldmillError("give either input files or --worklist (one of them)")
    model, executor, outputs = settings_from(args)
    if not model.is_demo and not Path(model.checkpoint).is_file():
        raise FoldmillError(f"{model.checkpoint}: checkpoint not found (or use --model demo)")
    if args.worklist:
        items = read_work_items(args.worklist)
    else:
        result = build_worklist(args.inputs, skip_bad=args.skip_bad)
        for reject in result.rejects.itertuples(index=False):
            print(f"foldmill: skipped {reject.source}: {reject.record}: {reject.problem}", file=sys.stderr)
        items = work_items(result.table)
    outdir = Path(args.outdir)
    try:
        run = fold_targets(
            items,
            outdir,
            outdir / "fold" / "fold.tsv",
            model,
            executor,
            Staging(args.staged),
            outputs,
        )
    except FoldInterrupted as interrupted:
        print(f"foldmill: {interrupted.message}", file=sys.stderr)
        return interrupted.exit_code
    if run.abort_reason:
        raise FoldmillError(run.abort_reason)
    return 0 if run.count("ok") == len(run.records) else 1

