"""Validation loss and perplexity over a corpus split (all processes share the batches)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from torch import nn

from foldmill.errors import CheckpointError, FoldmillError
from foldmill.moe.data.loader import PackedWindows
from foldmill.moe.train.distributed import Dist, all_reduce_sum
from foldmill.moe.train.loss import batch_loss


@torch.no_grad()
def evaluate(
    model: nn.Module, windows: PackedWindows, batch_size: int, max_batches: int, precision: str, env: Dist
) -> dict[str, float]:
    """Token-weighted mean cross-entropy over the first max_batches batches (0 = all windows)."""
    was_training = model.training
    model.eval()
    count = len(windows) if not max_batches else min(len(windows), max_batches * batch_size * env.world_size)
    # Every process runs the same number of batches: expert parallelism makes each forward collective.
    count -= count % env.world_size
    mine = np.arange(count)[env.rank :: env.world_size]
    totals = torch.zeros(2, dtype=torch.float64, device=env.device)
    for start in range(0, mine.size, batch_size):
        batch = windows.batch(mine[start : start + batch_size]).to(env.device)
        loss = batch_loss(model, batch, precision, aux_loss_coef=0.0)
        tokens = batch[:, 1:].numel()
        totals += torch.tensor([loss.cross_entropy.item() * tokens, tokens], dtype=torch.float64, device=env.device)
    all_reduce_sum(totals)
    model.train(was_training)
    mean = float(totals[0] / totals[1]) if totals[1] else float("nan")
    return {"val_loss": mean, "val_perplexity": math.exp(mean) if math.isfinite(mean) else float("nan"),
            "val_tokens": int(totals[1])}


def evaluate_checkpoint(corpus_dir: str | Path, checkpoint: str | Path, batch_size: int, max_batches: int) -> dict:
    """Load the model of a pretraining checkpoint and evaluate it on the corpus's validation split."""
    from foldmill.moe.config import ModelConfig, TrainConfig
    from foldmill.moe.data.corpus import alphabet_mismatch, load_meta
    from foldmill.moe.model.decoder import MoEDecoder
    from foldmill.moe.train.checkpoint import load_model_weights, read_state, resolve_checkpoint
    from foldmill.moe.train.distributed import init_distributed
    from foldmill.moe.train.precision import prepare_parameters

    if batch_size < 1 or max_batches < 0:
        raise FoldmillError(f"batch_size must be >= 1 and max_batches >= 0 (0: every batch), not {batch_size} "
                            f"and {max_batches}")
    checkpoint = resolve_checkpoint(checkpoint)
    env = init_distributed()
    state = read_state(checkpoint)
    model_config = ModelConfig(**state["model_config"])
    train_config = TrainConfig(**state["train_config"])
    mismatch = alphabet_mismatch(corpus_dir, load_meta(corpus_dir), model_config.vocab_size)
    if mismatch:
        raise CheckpointError(f"{checkpoint}: {mismatch}")
    model = MoEDecoder(model_config).to(env.device)
    prepare_parameters(model, train_config.precision)  # no optimizer here: the masters are not needed
    load_model_weights(checkpoint, model)
    windows = PackedWindows(corpus_dir, "val", train_config.seq_len)
    result = evaluate(model, windows, batch_size, max_batches, train_config.precision, env)
    return {**result, "checkpoint": str(checkpoint), "step": state["step"], "model": train_config.model,
            "expert_backend": model_config.expert_backend}
