"""Expert-parallel training throughput: tokens/s/GPU, MFU and the all-to-all share of a step.

Run under torchrun, one process per GPU (synthetic tokens, no corpus needed):

    torchrun --standalone --nproc-per-node=8 -m foldmill.moe.parallel.benchmark \
        --model bio_8x1b --expert-backend mxfp8 --expert-parallel 8 --out bench-ep

Each step is a full training step (forward, backward, expert-gradient reduction, clipping,
AdamW) on batch_size sequences per process. Two timed phases: plain steps give tokens/s/GPU and
MFU; then steps in which every all-to-all is bracketed by device synchronizations give the time
spent in the token exchange (its waits for the slowest rank included: that time is exposed, as
the experts cannot start before their tokens arrive). Rank 0 prints its numbers and writes
ep_bench_<world>gpu_ep<ep>.json to --out. Scaling efficiency = tokens/s/GPU here divided by
tokens/s/GPU of the same command with --nproc-per-node=1 --expert-parallel 1. A file of that name
that this benchmark did not write (its ledger `.foldmill-ep-bench`) stops it before it runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from foldmill.errors import FoldmillError
from foldmill.io.atomic import owned_files, refuse_foreign
from foldmill.moe.config import TrainConfig
from foldmill.moe.model.decoder import MoEDecoder
from foldmill.moe.parallel import expert_parallel
from foldmill.moe.parallel.gradients import clip_factor, reduce_expert_gradients
from foldmill.moe.train.distributed import Dist, init_distributed, unwrap, wrap_model
from foldmill.moe.train.loss import batch_loss
from foldmill.moe.train.metrics import mfu_columns, run_peaks
from foldmill.moe.train.optim import build_optimizer
from foldmill.moe.train.precision import prepare_parameters
from foldmill.moe.train.trainer import build_model_config

COMMAND = "ep-bench"  # the owner named in the --out directory's ledger


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def timed_all_to_all(device: torch.device) -> Iterator[list[float]]:
    """Within the block, every token all-to-all (forward and backward) appends its seconds to the list."""
    seconds: list[float] = []
    untimed = expert_parallel.all_to_all

    def timed(*args, **kwargs):
        _synchronize(device)
        start = time.perf_counter()
        out = untimed(*args, **kwargs)
        _synchronize(device)
        seconds.append(time.perf_counter() - start)
        return out

    expert_parallel.all_to_all = timed
    try:
        yield seconds
    finally:
        expert_parallel.all_to_all = untimed


def benchmark(config: TrainConfig, vocab_size: int, warmup: int, steps: int, env: Dist) -> dict:
    """Measure training steps of `config` on random tokens (each rank its own timings)."""
    model_config = build_model_config(config, vocab_size)
    torch.manual_seed(config.seed)
    model = MoEDecoder(model_config).to(env.device)
    masters = prepare_parameters(model, config.precision, env.world_size)
    model = wrap_model(model, config.parallel, env, config.expert_parallel)
    optimizer = build_optimizer(model, config, masters)
    generator = torch.Generator().manual_seed(config.seed + env.rank)
    batch = torch.randint(4, vocab_size, (config.batch_size, config.seq_len + 1), generator=generator).to(env.device)

    def step() -> None:
        loss = batch_loss(model, batch, config.precision, config.aux_loss_coef)
        loss.loss.backward()
        reduce_expert_gradients(unwrap(model))
        _, factor = clip_factor(unwrap(model), config.grad_clip)
        optimizer.step(grad_scale=factor)
        optimizer.zero_grad(set_to_none=True)

    def step_seconds() -> float:
        _synchronize(env.device)
        start = time.perf_counter()
        step()
        _synchronize(env.device)
        return time.perf_counter() - start

    for _ in range(warmup):
        step()
    if env.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(env.device)
    plain = statistics.median(step_seconds() for _ in range(steps))
    with timed_all_to_all(env.device) as exchanges:
        instrumented = [step_seconds() for _ in range(steps)]
    exchange_per_step = sum(exchanges) / steps
    tokens = config.batch_size * config.seq_len
    rate = tokens / plain
    return {
        "model": config.model, "expert_backend": config.expert_backend, "precision": config.precision,
        "parallel": config.parallel, "world_size": env.world_size, "expert_parallel": config.expert_parallel,
        "data_parallel": env.world_size // config.expert_parallel, "tokens_per_step_per_gpu": tokens,
        "step_ms": 1e3 * plain, "tokens_per_second_per_gpu": rate,
        **mfu_columns(rate, model_config, config.seq_len, run_peaks(env.device, config.peak_tflops)),
        "all_to_all_ms_per_step": 1e3 * exchange_per_step,
        "all_to_all_share": exchange_per_step / statistics.median(instrumented),
        "peak_memory_gib": torch.cuda.max_memory_allocated(env.device) / 2**30 if env.device.type == "cuda" else None,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="bio_8x1b")
    parser.add_argument("--expert-backend", default="mxfp8")
    parser.add_argument("--expert-parallel", type=int, default=1)
    parser.add_argument("--parallel", default="fsdp", choices=["ddp", "fsdp"])
    parser.add_argument("--precision", default="bf16-mixed")
    parser.add_argument("--batch-size", type=int, default=2, help="sequences per GPU and step")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--vocab-size", type=int, default=29, help="29: the protein tokenizer's")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--peak-tflops", type=float, default=0.0,
                        help="dense bf16 TFLOP/s per GPU for the MFU; 0: the GPU's spec peaks")
    parser.add_argument("--out", default="bench-ep")
    args = parser.parse_args(argv)
    config = TrainConfig(model=args.model, expert_backend=args.expert_backend, expert_parallel=args.expert_parallel,
                         parallel=args.parallel, precision=args.precision, batch_size=args.batch_size,
                         seq_len=args.seq_len, peak_tflops=args.peak_tflops)
    env = init_distributed()
    path = Path(args.out) / f"ep_bench_{env.world_size}gpu_ep{args.expert_parallel}.json"
    refuse_foreign(path.parent, COMMAND, [path.name])  # before the run, on every process alike
    result = benchmark(config, args.vocab_size, args.warmup, args.steps, env)
    if env.is_main:
        with owned_files([path], COMMAND, exclusive=False) as (temporary,):
            temporary.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print(json.dumps(result))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    except FoldmillError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
