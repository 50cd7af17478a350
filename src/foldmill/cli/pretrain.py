"""`foldmill pretrain`: pretrain mixture-of-experts models on FASTA corpora.

  foldmill pretrain prepare-corpus FASTA... -o CORPUS [--alphabet protein|nucleotide]
  foldmill pretrain train --corpus CORPUS --run-dir RUN [--model tiny --expert-backend mxfp8 --steps N ...]
  foldmill pretrain evaluate --corpus CORPUS --checkpoint RUN[/checkpoints/step_N] [-o evaluation.json]
`train` resumes from the newest checkpoint in RUN. For DDP / FSDP2 / expert parallelism run it under
torchrun, or give --processes N (it starts torchrun itself; with --nodes M, srun across a Slurm job).
Every option defaults to the workflow's `moe:` setting of the same name, so a step run by hand
does what the rule does.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import typing
from collections.abc import Mapping

from foldmill.cli import command_help
from foldmill.config import defaults, section_schema
from foldmill.io.atomic import owned_files
from foldmill.moe.config import TrainConfig


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("pretrain", help=command_help(__doc__))
    commands = parser.add_subparsers(dest="pretrain_command", required=True, metavar="STEP")
    workflow, keys = defaults("moe"), section_schema("moe")["properties"]

    prepare = commands.add_parser("prepare-corpus", help="tokenize, pack and shard FASTA files (train/val split)")
    prepare.add_argument("fasta", nargs="+", help="FASTA files (.gz allowed): proteomes, UniRef, genomes")
    prepare.add_argument("-o", "--out", required=True, help="corpus directory")
    prepare.add_argument("--alphabet", default=workflow["alphabet"], choices=keys["alphabet"]["enum"],
                         help=f"(default: {workflow['alphabet']})")
    prepare.add_argument("--val-fraction", type=float, default=workflow["val_fraction"],
                         help=f"records held out for validation (default: {workflow['val_fraction']})")
    prepare.add_argument("--shard-tokens", type=int, default=workflow["shard_tokens"],
                         help=f"tokens per shard file (default: {workflow['shard_tokens']})")
    prepare.set_defaults(handler=run_prepare)

    train = commands.add_parser("train", help="train (or resume) a run")
    train.add_argument("--corpus", required=True, help="a directory written by prepare-corpus")
    train.add_argument("--run-dir", required=True, help="metrics.jsonl, checkpoints/ and summary.json go here")
    add_config_arguments(train, TrainConfig, keys)
    train.add_argument("--processes", type=int, default=1, help="processes per node, one per GPU (> 1: torchrun)")
    train.add_argument("--nodes", type=int, default=1, help="nodes of the Slurm job to train on (> 1: srun)")
    train.set_defaults(handler=run_train)

    evaluate = commands.add_parser("evaluate", help="validation loss and perplexity of a checkpoint")
    evaluate.add_argument("--corpus", required=True)
    evaluate.add_argument("--checkpoint", required=True,
                          help="a checkpoints/step_* directory, or a run directory (its newest checkpoint)")
    evaluate.add_argument("--batch-size", type=int, default=workflow["batch_size"],
                          help=f"(default: {workflow['batch_size']})")
    evaluate.add_argument("--max-batches", type=int, default=workflow["eval_batches"],
                          help=f"(default: {workflow['eval_batches']}; 0 = the whole validation split)")
    evaluate.add_argument("-o", "--out", help="write the result as JSON here (a new file, or one it wrote before)")
    evaluate.set_defaults(handler=run_evaluate)


def add_config_arguments(parser: argparse.ArgumentParser, config_class: type,
                         keys: Mapping[str, Mapping[str, object]]) -> None:
    """One --option per field of the config dataclass, with the default, choices and help of the
    workflow schema's key of that name (`keys`), so a step run by hand does what the rule does and
    `--help` says what the config reference says."""
    hints = typing.get_type_hints(config_class)
    for field in dataclasses.fields(config_class):
        key = keys[field.name]
        default = key["default"]
        is_bool = hints[field.name] is bool
        shown = str(default).lower() if is_bool else default
        # argparse %-formats help text.
        text = f"{key['description']} (default: {shown})".replace("%", "%%")
        parser.add_argument(f"--{field.name.replace('_', '-')}", dest=field.name,
                            type=_parse_bool if is_bool else hints[field.name], default=default,
                            choices=key.get("enum"), metavar="{true,false}" if is_bool else None, help=text)


def _parse_bool(text: str) -> bool:
    """`True`/`False` as train_arguments writes them (bool("False") would be True)."""
    if text.lower() in ("true", "1", "yes", "on"):
        return True
    if text.lower() in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def config_from_args(args: argparse.Namespace, config_class: type):
    return config_class(**{f.name: getattr(args, f.name) for f in dataclasses.fields(config_class)})


def run_prepare(args: argparse.Namespace) -> int:
    from foldmill.moe.data.corpus import prepare_corpus

    meta = prepare_corpus(args.fasta, args.out, args.alphabet, args.val_fraction, args.shard_tokens)
    splits = meta["splits"]
    print(f"{splits['train']['records']} train / {splits['val']['records']} val records "
          f"({splits['train']['tokens']} / {splits['val']['tokens']} tokens), "
          f"{meta['rejected_records']} rejected -> {args.out}")
    return 0


def run_train(args: argparse.Namespace) -> int:
    from foldmill.moe.train.launch import launch_pretrain

    config = config_from_args(args, TrainConfig)
    summary = launch_pretrain(args.corpus, args.run_dir, config, args.processes, args.nodes)
    launched = args.processes > 1 or args.nodes > 1
    if launched or os.environ.get("RANK", "0") != "0":  # under torchrun only the first process reports
        return 0
    train_loss = summary["final_train_loss"]  # None where the run's log lost its training lines
    print(f"step {summary['steps']}: train loss {'unknown' if train_loss is None else f'{train_loss:.4f}'}, "
          f"val loss {summary['val_loss']:.4f} (perplexity {summary['val_perplexity']:.2f}) -> {args.run_dir}")
    return 0


def run_evaluate(args: argparse.Namespace) -> int:
    from foldmill.moe.train.evaluate import evaluate_checkpoint

    result = evaluate_checkpoint(args.corpus, args.checkpoint, args.batch_size, args.max_batches)
    text = json.dumps(result, indent=2) + "\n"
    if args.out:  # replaces only a file this command wrote (the ledger beside it)
        with owned_files([args.out], "evaluate", exclusive=False) as (temporary,):
            temporary.write_text(text, encoding="utf-8")
    print(text, end="")
    return 0
