"""The pretraining loop: data, model, AdamW, clipping, schedule, metrics, evaluation, exact resume.

Run once per process (torchrun starts several for DDP/FSDP2). A run directory holds
metrics.jsonl, checkpoints/step_*/ and, when training finished, summary.json, all listed in its
ledger (RUN_FILES). Starting again on the same directory resumes from the newest checkpoint and
reproduces the uninterrupted run exactly (same batches, same optimizer state; bit for bit on CPU);
on a finished run it returns the summary and writes nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import re
import time
from pathlib import Path

import torch

from foldmill.errors import CheckpointError, FoldmillError, is_out_of_memory
from foldmill.io.atomic import adopt_earlier, claim, refuse_foreign, write_text_atomic
from foldmill.moe.config import (
    SAME_VALUES_EITHER_WAY,
    ModelConfig,
    TrainConfig,
    memory_saving_settings,
    model_config,
)
from foldmill.moe.data.corpus import alphabet_mismatch, load_meta
from foldmill.moe.data.loader import BatchSampler, PackedWindows, document_ids
from foldmill.moe.model.decoder import MoEDecoder
from foldmill.moe.parallel.gradients import clip_factor, reduce_expert_gradients
from foldmill.moe.train.checkpoint import latest_checkpoint, load_checkpoint, read_state, save_checkpoint
from foldmill.moe.train.compile import compile_dense_blocks
from foldmill.moe.train.distributed import (
    Dist,
    all_reduce_sum,
    deferred_gradient_sync,
    init_distributed,
    step_can_be_captured,
    unwrap,
    wrap_model,
)
from foldmill.moe.train.evaluate import evaluate
from foldmill.moe.train.graphs import CapturedForwardBackward, built_on_capture_stream
from foldmill.moe.train.loss import accumulate_gradients, batch_loss
from foldmill.moe.train.metrics import MetricsLog, attended_fraction, mfu_columns, run_peaks
from foldmill.moe.train.optim import build_optimizer, learning_rate, set_learning_rate
from foldmill.moe.train.precision import prepare_parameters
from foldmill.moe.train.run_lock import exclusive_run

log = logging.getLogger(__name__)


def build_model_config(config: TrainConfig, vocab_size: int, overrides: dict | None = None) -> ModelConfig:
    """The named model of `config`, with `overrides` (e.g. a reduced depth or width) applied first."""
    base = model_config(config.model, **(overrides or {}))
    return dataclasses.replace(
        base, vocab_size=vocab_size, max_seq_len=max(base.max_seq_len, config.seq_len),
        expert_backend=config.expert_backend, recompute_experts=config.recompute_experts,
        # Only the FP8 backend reads it; off elsewhere, so a bf16 run's configuration (and its
        # checkpoints' compatibility) does not depend on it.
        fp8_fast_accumulation=config.fp8_fast_accumulation and config.expert_backend == "fp8_rowwise",
        mxfp8_store_swiglu_input=config.mxfp8_store_swiglu_input,
        keep_weight_copies=config.keep_weight_copies,
        aux_loss_coef=config.aux_loss_coef,
    )


# What a checkpoint written before a field existed ran with, where that differs from the field's
# default: FP8 GEMMs promoted their sums to fp32 before fp8_fast_accumulation (on by default) came.
BEFORE_FIELD_EXISTED = {"fp8_fast_accumulation": False}


def _check_step_fits_corpus(corpus_dir: str | Path, windows: int, step_sequences: int, seq_len: int,
                            processes: int) -> None:
    """One optimizer step must not draw a window twice: a batch larger than the corpus is a typo, and
    would otherwise be stacked from thousands of epochs before the first step."""
    if step_sequences > windows // processes:
        raise FoldmillError(
            f"{corpus_dir}: {windows} training windows of {seq_len} tokens give each of {processes} "
            f"process(es) {windows // processes}, fewer than the {step_sequences} sequences of one optimizer step "
            "(batch_size x gradient_accumulation_steps); lower moe.batch_size or moe.seq_len, or add sequences"
        )


# What a run directory holds, all written by the trainer; its ledger lists them (foldmill.io.atomic).
RUN_FILES = ("metrics.jsonl", "summary.json", "checkpoints")
COMMAND = "pretrain"


def check_run_directory(run_dir: Path) -> None:
    """Refuse, before anything is written, a run directory where one of RUN_FILES exists but training
    did not write it; files of other names are left alone. A run written before the ledger existed
    is recognised by its checkpoint."""
    adopt_earlier(run_dir, COMMAND, lambda directory, _: latest_checkpoint(directory / "checkpoints") is not None,
                  RUN_FILES)
    refuse_foreign(run_dir, COMMAND, RUN_FILES)


def _settings_that_differ(saved: dict, current: dict) -> list[str]:
    """The model settings a user must change to resume: fp8_fast_accumulation follows the expert
    backend (build_model_config), so where the backends differ, naming it would ask for a value the
    user never changed."""
    names = [name for name in sorted(set(saved) | set(current)) if saved.get(name) != current.get(name)]
    if "expert_backend" in names:
        return [name for name in names if name != "fp8_fast_accumulation"]
    return names


def _with_defaults(saved: dict) -> dict:
    """A checkpoint's model configuration with the fields added since it was written at the values it
    ran with (their defaults, or BEFORE_FIELD_EXISTED)."""
    defaults = {field.name: field.default for field in dataclasses.fields(ModelConfig)} | BEFORE_FIELD_EXISTED
    return {**{name: value for name, value in defaults.items() if name not in saved}, **saved}


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Trainer:
    def __init__(self, corpus_dir: str | Path, run_dir: str | Path, config: TrainConfig, env: Dist | None = None,
                 model_overrides: dict | None = None) -> None:
        self.config = config
        self.env = env or init_distributed()
        self.run_dir = Path(run_dir)
        check_run_directory(self.run_dir)
        meta = load_meta(corpus_dir)
        self.corpus_dir, self.corpus_meta = Path(corpus_dir), meta
        self.train_windows = PackedWindows(corpus_dir, "train", config.seq_len)
        self.val_windows = PackedWindows(corpus_dir, "val", config.seq_len)
        # One draw per optimizer step: its micro-batches' sequences; checked before the model is built.
        step_sequences = config.batch_size * config.gradient_accumulation_steps
        _check_step_fits_corpus(corpus_dir, len(self.train_windows), step_sequences, config.seq_len,
                                self.env.world_size)
        self.sampler = BatchSampler(len(self.train_windows), step_sequences, config.seed, self.env.rank,
                                    self.env.world_size)
        self.model_config = build_model_config(config, meta["vocab_size"], model_overrides)
        torch.manual_seed(config.seed)
        model = MoEDecoder(self.model_config).to(self.env.device)
        masters = prepare_parameters(model, config.precision, self.env.world_size)
        # Optimizations in this order: compile the dense blocks, then distribute (DDP / FSDP2), then
        # capture the step (DDP built on the stream that captures it: train/graphs.py).
        if config.compile and self.env.device.type == "cuda":
            compile_dense_blocks(model)
        graphs = config.cuda_graphs and self.env.device.type == "cuda"
        capture = graphs and step_can_be_captured(config.parallel, config.expert_parallel)
        wrap = functools.partial(wrap_model, model, config.parallel, self.env, config.expert_parallel)
        self.model, stream = built_on_capture_stream(wrap, self.env.device) if capture else (wrap(), None)
        self.optimizer = build_optimizer(self.model, config, masters)
        if self.env.is_main:
            claim(self.run_dir, RUN_FILES, COMMAND)
        self.metrics = MetricsLog(self.run_dir / "metrics.jsonl", self.env.is_main)
        self.peaks = run_peaks(self.env.device, config.peak_tflops)
        self.step = 0
        self.attended_fractions: list[float] = []  # per step since the last log line (train_step)
        self.captured: CapturedForwardBackward | None = None
        if capture:
            self.captured = CapturedForwardBackward(self.model, self._loss_and_metrics,
                                                    config.gradient_accumulation_steps, stream)
        elif graphs:
            log.info("moe.cuda_graphs: off with %d processes (steps are captured in runs of one process)",
                     self.env.world_size)

    @property
    def checkpoint_root(self) -> Path:
        return self.run_dir / "checkpoints"

    def _state(self) -> dict:
        return {"sampler": self.sampler.state_dict(), "model_config": dataclasses.asdict(self.model_config),
                "train_config": dataclasses.asdict(self.config)}

    def resume(self) -> bool:
        """Load the newest checkpoint of this run, if any."""
        latest = latest_checkpoint(self.checkpoint_root)
        if latest is None:
            return False
        self._check_same_model(latest)
        state = load_checkpoint(latest, self.model, self.optimizer)
        self.sampler.load_state_dict(state["sampler"])
        self.step = int(state["step"])
        log.info("resumed from %s (step %d)", latest, self.step)
        return True

    def _check_same_model(self, checkpoint: Path) -> None:
        """Refuse, before reading its weights, a checkpoint of another model than this run builds."""
        saved = _with_defaults(read_state(checkpoint)["model_config"])
        mismatch = alphabet_mismatch(self.corpus_dir, self.corpus_meta, saved["vocab_size"])
        if mismatch:
            raise CheckpointError(f"{checkpoint}: {mismatch}, or a new run directory")
        saved, current = ({name: value for name, value in fields.items() if name not in SAME_VALUES_EITHER_WAY}
                          for fields in (saved, dataclasses.asdict(self.model_config)))
        if saved != current:
            differing = ", ".join(f"{name} {saved.get(name)!r} there, {current.get(name)!r} here"
                                  for name in _settings_that_differ(saved, current))
            raise CheckpointError(f"{checkpoint}: written for another model configuration ({differing}); "
                                  "set those values to resume, or use a new run directory")

    def save(self) -> Path:
        return save_checkpoint(self.checkpoint_root, self.step, self.model, self.optimizer, self._state(), self.env)

    def validate(self) -> dict[str, float]:
        return evaluate(self.model, self.val_windows, self.config.batch_size, self.config.eval_batches,
                        self.config.precision, self.env)

    def _loss_and_metrics(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        loss = batch_loss(self.model, batch, self.config.precision, self.config.aux_loss_coef)
        return loss.loss, loss.cross_entropy, loss.expert_load

    def train_step(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One optimizer step; returns (cross-entropy, grad norm, expert load), on the device."""
        self.step += 1
        set_learning_rate(self.optimizer, learning_rate(self.step, self.config))
        windows = self.train_windows.batch(self.sampler.next_indices())
        # For the MFU: the attention FLOPs of the pairs this batch's records keep.
        self.attended_fractions.append(attended_fraction(document_ids(windows[:, :-1])))
        batch = windows.to(self.env.device, non_blocking=True)
        if self.captured is not None:
            _, cross_entropy, load = self.captured(batch)
        else:
            _, cross_entropy, load = accumulate_gradients(self._loss_and_metrics, batch,
                                                          self.config.gradient_accumulation_steps,
                                                          deferred_gradient_sync(self.model))
        reduce_expert_gradients(unwrap(self.model))
        grad_norm, factor = clip_factor(unwrap(self.model), self.config.grad_clip)
        self.optimizer.step(grad_scale=factor)  # clips as it updates
        # A captured backward writes into the same gradient tensors on every replay: keep them.
        if self.captured is None:
            self.optimizer.zero_grad(set_to_none=True)
        return cross_entropy.detach(), grad_norm.detach(), load

    def _finished_summary(self) -> dict | None:
        """summary.json of this run when it already holds the final step and its checkpoint, on every
        process alike (a process that cannot read it makes all of them finish the run again)."""
        path = self.run_dir / "summary.json"
        latest = latest_checkpoint(self.checkpoint_root)
        summary = None
        if self.step == self.config.steps and latest is not None and path.is_file():
            try:
                summary = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError):
                summary = None
            if not (isinstance(summary, dict) and summary.get("steps") == self.step
                    and Path(str(summary.get("checkpoint"))).name == latest.name):
                summary = None
        everywhere = all_reduce_sum(torch.tensor([float(summary is not None)], device=self.env.device))
        return summary if int(everywhere.item()) == self.env.world_size else None

    def describe(self) -> str:
        """What this run trains and how, in one line (logged as it starts)."""
        config, env = self.config, self.env
        device = torch.cuda.get_device_name(env.device) if env.device.type == "cuda" else "CPU"
        peaks = " and ".join(f"{value:,g} TFLOP/s {precision}" for precision, value in self.peaks.items())
        sequences = f"{config.batch_size} sequence{'' if config.batch_size == 1 else 's'}"
        return (f"training {config.model} from step {self.step} to {config.steps}: {sequences} of "
                f"{config.seq_len:,} tokens per micro-batch, {config.gradient_accumulation_steps} per optimizer step, "
                f"on {env.world_size} x {device}; experts {config.expert_backend}, precision {config.precision}, "
                f"CUDA graphs {'on' if self.captured is not None else 'off'}; "
                + (f"MFU against {peaks}" if peaks else "no MFU (no peak known: moe.peak_tflops)"))

    def fit(self) -> dict:
        """Train up to config.steps (resuming if possible); returns the summary written to summary.json."""
        with exclusive_run(self.run_dir, self.env):
            return self._train()

    def _train(self) -> dict:
        config, env = self.config, self.env
        self.resume()
        logged = self.metrics.keep_up_to(self.step)
        if self.step > config.steps:
            raise FoldmillError(f"{self.run_dir}: already trained to step {self.step}, past the {config.steps} steps "
                                "asked for; ask for more steps to continue it, or use a new run directory")
        finished = self._finished_summary()
        if finished is not None:
            if env.is_main:
                log.info("%s: finished at step %d; summary.json kept", self.run_dir, self.step)
            return finished
        if env.is_main:
            log.info(self.describe())
        tokens_per_step = config.batch_size * config.gradient_accumulation_steps * config.seq_len
        window_losses: list[torch.Tensor] = []
        # Until the first log line of this process: what the run logged last, if it runs no step here.
        utilization = mfu_columns(0.0, self.model_config, config.seq_len, {})
        last = next((record for record in reversed(logged) if "loss" in record), {"tokens_per_second_per_gpu": None})
        utilization = {column: last.get(column) for column in utilization}
        _synchronize(env.device)
        started, steps_in_window = time.perf_counter(), 0
        while self.step < config.steps:
            cross_entropy, grad_norm, load = self.train_step()
            window_losses.append(cross_entropy)
            steps_in_window += 1
            if self.step % config.log_every == 0 or self.step == config.steps:
                _synchronize(env.device)
                elapsed = time.perf_counter() - started
                rate = steps_in_window * tokens_per_step / elapsed
                utilization = mfu_columns(rate, self.model_config, config.seq_len, self.peaks,
                                          sum(self.attended_fractions) / len(self.attended_fractions))
                window_loss = all_reduce_sum(torch.stack(window_losses).mean().reshape(1)) / env.world_size
                last = {
                    "step": self.step, "loss": float(window_loss),
                    "lr": learning_rate(self.step, config), "grad_norm": float(grad_norm),
                    "tokens_per_second_per_gpu": rate,
                    **utilization,
                    # max expert load x experts: 1.0 is perfectly balanced, per layer
                    "router_max_load": [round(float(v), 4) for v in load.max(dim=-1).values * load.shape[-1]],
                }
                self.metrics.write(last)
                if env.is_main:
                    shown = "".join(f" {name} {value:.3f}" for name, value in utilization.items() if value is not None)
                    log.info("step %d loss %.4f lr %.2e %.0f tok/s/gpu%s", self.step, last["loss"], last["lr"], rate,
                             shown)
                window_losses, steps_in_window, self.attended_fractions = [], 0, []
                _synchronize(env.device)
                started = time.perf_counter()
            evaluate_now = config.eval_every and self.step % config.eval_every == 0 and self.step < config.steps
            save_now = config.checkpoint_every and self.step % config.checkpoint_every == 0
            if evaluate_now or save_now:
                # Validation and checkpoints pause training: the window's tokens/s and MFU leave them out.
                _synchronize(env.device)
                paused = time.perf_counter()
                if evaluate_now:
                    self.metrics.write({"step": self.step, **self.validate()})
                if save_now:
                    self.save()
                _synchronize(env.device)
                started += time.perf_counter() - paused
        checkpoint = latest_checkpoint(self.checkpoint_root)
        if checkpoint is None or not checkpoint.name.endswith(f"{self.step:08d}"):
            checkpoint = self.save()
        validation = self.validate()
        self.metrics.write({"step": self.step, **validation})
        summary = {
            "steps": self.step, "final_train_loss": last.get("loss"), **validation,
            "tokens_per_second_per_gpu": last["tokens_per_second_per_gpu"], **utilization,
            "world_size": env.world_size, "checkpoint": str(checkpoint),
            "model_config": dataclasses.asdict(self.model_config), "train_config": dataclasses.asdict(config),
        }
        if env.is_main:
            write_text_atomic(self.run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
        return summary


def pretrain(corpus_dir: str | Path, run_dir: str | Path, config: TrainConfig) -> dict:
    """Train (resuming); a run out of memory ends in one line naming the settings that would fit it."""
    try:
        return Trainer(corpus_dir, run_dir, config).fit()
    except Exception as error:
        if not is_out_of_memory(error):
            raise
        raise FoldmillError(out_of_memory_message(run_dir, config, error)) from None


def out_of_memory_message(run_dir: str | Path, config: TrainConfig, error: BaseException) -> str:
    """What ran out, the checkpoint the run goes on from, and the settings that would fit it."""
    # The first two sentences, without the CPU allocator's "[enforce fail at ...] err == 0." prefix.
    first_line = (str(error) or type(error).__name__).splitlines()[0]
    first_line = re.sub(r"^\[enforce fail at [^\]]*\][^.]*\.\s*", "", first_line)
    what = ". ".join(first_line.split(". ")[:2]).rstrip(".")
    latest = latest_checkpoint(Path(run_dir) / "checkpoints")
    where = f"the run goes on from {latest.name}" if latest else "no checkpoint yet"
    settings = memory_saving_settings(config)
    fixes = f"To fit it, set one of: {'; '.join(settings)}" if settings else (
        "Every memory setting is on: shard the model over more GPUs (--processes with moe.parallel: fsdp)")
    return f"{run_dir}: out of memory ({what}); {where}. {fixes}"


def model_parameters(trainer: Trainer) -> dict[str, torch.Tensor]:
    """The unwrapped model's parameters (for tests and tools)."""
    return dict(unwrap(trainer.model).named_parameters())
