"""Start pretraining in this process, or under torchrun with one process per GPU."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

from foldmill.errors import FoldmillError
from foldmill.moe.config import TrainConfig


def train_arguments(corpus_dir: str | Path, run_dir: str | Path, config: TrainConfig) -> list[str]:
    """`foldmill pretrain train` arguments reproducing `config`."""
    arguments = ["pretrain", "train", "--corpus", str(corpus_dir), "--run-dir", str(run_dir)]
    for field in dataclasses.fields(config):
        arguments += [f"--{field.name.replace('_', '-')}", str(getattr(config, field.name))]
    return arguments


def launch_pretrain(corpus_dir: str | Path, run_dir: str | Path, config: TrainConfig, processes: int) -> dict:
    """Train with `processes` workers (torchrun, one per GPU) or in this process when processes <= 1."""
    if processes <= 1:
        from foldmill.moe.train.trainer import pretrain

        return pretrain(corpus_dir, run_dir, config)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}",
               "-m", "foldmill", *train_arguments(corpus_dir, run_dir, config)]
    completed = subprocess.run(command, check=False)
    if completed.returncode:
        raise FoldmillError(f"torchrun pretraining with {processes} processes failed (exit {completed.returncode})")
    return json.loads((Path(run_dir) / "summary.json").read_text(encoding="utf-8"))
