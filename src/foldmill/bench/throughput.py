"""`foldmill bench throughput`: residues folded per GPU-hour end to end, foldmill vs OSS Boltz-2.

The fixed worklist: `--targets` two-chain protein targets whose combined length is drawn uniformly
from [--min-length, --max-length] (seeded), each with a synthetic MSA of `--msa-depth` rows per
chain (A3M files), written as Boltz YAML inputs. A seeded `--sample` of it is what both sides fold,
with the anchor recipe (3 recycles, 200 sampling steps, 5 diffusion samples by default):
  foldmill  worklist -> featurize -> fold -> written outputs, timed from reading the YAML files to
            the last written target (Ray and model start-up included);
  oss       `boltz predict` on the same YAML directory (with --oss, when `boltz` is importable). It
            needs --boltz-cache, a Boltz cache as `boltz predict` leaves it (mols/, and non-empty
            boltz2_conf.ckpt and boltz2_aff.ckpt, or it tries to download them). Both sides load the
            same weights: the --model checkpoint, or the demo's seeded weights exported to
            OUT/<model>.ckpt (passed to boltz as --checkpoint).
Residues per GPU-hour = residues of the targets written / (wall hours x GPUs). The foldmill row also
reports replica busy time and the idle gaps between targets; timeline.tsv has every target's
featurize, fold (start/end on its replica) and write times.

--batching measures cross-target batching before the executor uses it: for each length in
--batch-lengths, --batch-size targets folded one after another vs stacked into one forward of the
same model and recipe (writes batching.tsv; none of the anchor systems batches across targets).

--plan-only measures the executor without a model: a synthetic worklist of --targets targets is
sharded and planned, then pushed through the real Ray actor pools and bounded queues with
pass-through stages, recording time and the driver's memory (flat memory on 20,000 targets).

Writes OUT/throughput.tsv and OUT/throughput.md (and timeline.tsv, inputs/, runs/).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import logging
import math
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from foldmill.errors import FoldmillError
from foldmill.executor.cluster import ray_session, start_pools, stop_pools
from foldmill.executor.engine import DEMO_WEIGHTS_SEED, Engine, Staging
from foldmill.executor.plan import plan_run
from foldmill.executor.records import Journal, journal_path
from foldmill.executor.run import RunResult, fold_targets, work_items
from foldmill.executor.scheduler import Scheduler
from foldmill.executor.settings import DEVICES, ExecutorSettings, ModelSettings
from foldmill.features import featurize, stack_featurized
from foldmill.io.atomic import atomic_path, write_text_atomic
from foldmill.io.targets import Entity, Target
from foldmill.io.worklist import build_worklist, summarize
from foldmill.model.config import Boltz2Config, InferenceRecipe
from foldmill.model.demo import demo_model
from foldmill.bench._synthetic import AMINO_ACID_FREQUENCIES, AMINO_ACIDS, synthetic_msa
from foldmill.runtime.sharding import plan_shards

log = logging.getLogger(__name__)

TABLE_COLUMNS = [
    "system", "targets", "written", "residues", "wall_s", "gpus", "residues_per_gpu_hour",
    "fold_s", "busy_fraction", "idle_between_targets_fraction", "ratio_vs_oss",
]  # fmt: skip


@dataclass(frozen=True)
class SyntheticTarget:
    target_id: str
    sequences: tuple[str, str]

    @property
    def residues(self) -> int:
        return sum(len(sequence) for sequence in self.sequences)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "throughput",
        help="end-to-end residues per GPU-hour, foldmill vs OSS Boltz-2 (or --plan-only: executor overhead)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-o", "--out", type=Path, default=Path("bench-throughput"), help="output directory")
    parser.add_argument("--targets", type=int, default=1000, help="size of the fixed worklist")
    parser.add_argument("--sample", type=int, default=0, help="targets of the worklist both sides fold (0 = all)")
    parser.add_argument("--seed", type=int, default=0, help="seed of lengths, sequences, MSAs and the sample")
    parser.add_argument("--min-length", type=int, default=200, help="shortest combined length of a target")
    parser.add_argument("--max-length", type=int, default=2800, help="longest combined length of a target")
    parser.add_argument("--msa-depth", type=int, default=2048, help="MSA rows per chain (query included)")
    parser.add_argument("--model", default="demo-full",
                        help="checkpoint, 'demo-full' (released architecture, random weights) or 'demo' (small)")
    parser.add_argument("--device", choices=DEVICES, default="cuda")
    parser.add_argument("--recycling-steps", type=int, default=3)
    parser.add_argument("--sampling-steps", type=int, default=200)
    parser.add_argument("--diffusion-samples", type=int, default=5)
    parser.add_argument("--max-parallel-samples", type=int, default=5)
    parser.add_argument("--cpu-workers", type=int, default=4, help="featurize actors and writers")
    parser.add_argument("--oss", action="store_true", help="also run `boltz predict` on the same sample")
    parser.add_argument("--boltz-cache", type=Path, help="Boltz cache with mols/ (for --oss)")
    parser.add_argument("--plan-only", action="store_true", help="no model: planning and queueing only")
    parser.add_argument("--batching", action="store_true", help="only measure batched vs one-by-one forwards")
    parser.add_argument("--batch-lengths", default="128,256,384", help="target lengths (tokens) for --batching")
    parser.add_argument("--batch-size", type=int, default=4, help="targets per batch for --batching")
    parser.set_defaults(handler=run)


# -- the fixed worklist ------------------------------------------------------------------------

def synthetic_worklist(count: int, seed: int, min_length: int, max_length: int) -> list[SyntheticTarget]:
    """Two-chain targets, combined length uniform in [min_length, max_length], chains split 25-75%."""
    if not 2 <= min_length <= max_length:
        raise FoldmillError(f"need 2 <= --min-length <= --max-length, got {min_length}, {max_length}")
    rng = np.random.default_rng(seed)
    targets = []
    for index in range(count):
        total = int(rng.integers(min_length, max_length + 1))
        first = int(np.clip(round(total * rng.uniform(0.25, 0.75)), 1, total - 1))
        chains = tuple("".join(rng.choice(AMINO_ACIDS, size=n, p=AMINO_ACID_FREQUENCIES)) for n in (first, total - first))
        targets.append(SyntheticTarget(f"dimer_{index:05d}", chains))
    return targets


def sample_targets(targets: list[SyntheticTarget], size: int, seed: int) -> list[SyntheticTarget]:
    """A seeded sample (in worklist order); size 0 or >= the worklist = all of it."""
    if size <= 0 or size >= len(targets):
        return list(targets)
    chosen = np.sort(np.random.default_rng(seed + 1).choice(len(targets), size=size, replace=False))
    return [targets[i] for i in chosen]


def write_inputs(targets: list[SyntheticTarget], directory: Path, msa_depth: int, seed: int) -> Path:
    """One Boltz YAML per target in `directory`, its chains' A3M files beside it in `directory`.msa
    (OSS accepts no subdirectory among its inputs), named by absolute path; both sides read these."""
    msa_dir = (directory.parent / f"{directory.name}.msa").resolve()
    msa_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed + 2)
    for target in targets:
        entries = []
        for chain, sequence in zip("AB", target.sequences):
            msa = msa_dir / f"{target.target_id}_{chain}.a3m"
            if not msa.exists():
                write_text_atomic(msa, synthetic_msa(sequence, msa_depth, rng))
            entries.append(f"  - protein:\n      id: {chain}\n      sequence: {sequence}\n      msa: {msa}\n")
        write_text_atomic(directory / f"{target.target_id}.yaml", "version: 1\nsequences:\n" + "".join(entries))
    return directory


# -- foldmill ------------------------------------------------------------------------------------

def demo_architecture(model: str) -> Boltz2Config | None:
    """The architecture of a demo model name (None for a checkpoint path)."""
    return {"demo-full": Boltz2Config(), "demo": Boltz2Config.small()}.get(model)


def model_settings_for(args: argparse.Namespace, checkpoint: Path | None = None) -> ModelSettings:
    """The model both sides use: a checkpoint, or the demo's seeded random weights at a demo architecture."""
    recipe = InferenceRecipe(args.recycling_steps, args.sampling_steps, args.diffusion_samples, args.max_parallel_samples, args.seed)
    architecture = demo_architecture(args.model)
    if checkpoint is not None or architecture is None:
        return ModelSettings(str(checkpoint or args.model), args.device, recipe)
    full = {f.name: getattr(architecture, f.name) for f in dataclasses.fields(Boltz2Config)}
    return ModelSettings("demo", args.device, recipe, demo_config=full)


def export_demo_checkpoint(architecture: Boltz2Config, path: Path) -> Path:
    """The demo's seeded weights as a Lightning-style checkpoint that foldmill and `boltz predict`
    both load, so the two sides of the comparison fold with identical weights."""
    from importlib.metadata import version

    from omegaconf import OmegaConf  # OSS Boltz-2 reads its training_args by attribute

    from foldmill.bench._oss_reference import oss_hyperparameters

    hyperparameters = oss_hyperparameters(architecture)
    hyperparameters["training_args"] = OmegaConf.create(
        {"max_lr": 1e-3, "weight_decay": 0.0, "diffusion_multiplicity": 16, "recycling_steps": 3}
    )
    checkpoint = {
        "state_dict": demo_model(architecture, seed=DEMO_WEIGHTS_SEED).state_dict(),
        "hyper_parameters": hyperparameters,
        "pytorch-lightning_version": version("pytorch-lightning"),
    }
    with atomic_path(path) as tmp:
        torch.save(checkpoint, tmp)
    return path


def run_foldmill(inputs: Path, out: Path, model: ModelSettings, cpu_workers: int) -> tuple[RunResult, float]:
    """Fold every YAML in `inputs`; (result, wall seconds from reading the inputs to the last write)."""
    started = time.monotonic()
    worklist = build_worklist([inputs])
    result = fold_targets(
        work_items(worklist.table), out, out / "fold" / "fold.tsv", model, ExecutorSettings(cpu_workers=cpu_workers), Staging()
    )
    return result, time.monotonic() - started


def timeline(table: Path) -> pd.DataFrame:
    """Per target: replica, tokens, featurize seconds, fold start/end (s from the first fold), write
    seconds, and the model's own stages (trunk, conditioning, diffusion, confidence on the GPU fast path)."""
    records = [r for r in Journal.read(journal_path(table)).values() if r.status == "ok" and r.fold_started]
    base = ["target_id", "replica", "n_tokens", "featurize_s", "fold_start_s", "fold_end_s", "write_s"]
    rows = [
        dict(zip(base, (r.target_id, r.replica, r.n_tokens, r.featurize_seconds, r.fold_started, r.fold_finished, r.write_seconds)))
        | {f"model_{stage}_s": seconds for stage, seconds in r.model_stages.items()}
        for r in records
    ]
    stages = sorted({key for row in rows for key in row} - set(base))
    frame = pd.DataFrame(rows, columns=base + stages)
    if len(frame):
        origin = frame["fold_start_s"].min()
        frame[["fold_start_s", "fold_end_s"]] -= origin
    return frame.sort_values(["replica", "fold_start_s"]).reset_index(drop=True)


def idle_between_targets(frame: pd.DataFrame) -> float:
    """Share of each replica's span (first fold start to last fold end) with no fold running."""
    idle = span = 0.0
    for _, rows in frame.groupby("replica"):
        gaps = rows["fold_start_s"].to_numpy()[1:] - rows["fold_end_s"].to_numpy()[:-1]
        idle += float(np.clip(gaps, 0, None).sum())
        span += float(rows["fold_end_s"].max() - rows["fold_start_s"].min())
    return idle / span if span else math.nan


def foldmill_row(result: RunResult, wall: float, frame: pd.DataFrame, targets: int) -> dict[str, object]:
    written = [r for r in result.records if r.status == "ok"]
    residues = sum(r.n_tokens for r in written)
    gpus = max(1, len(result.busy))
    busy = sum(result.busy.values()) / (result.fold_seconds * gpus) if result.fold_seconds else math.nan
    return {
        "system": "foldmill", "targets": targets, "written": len(written), "residues": residues, "wall_s": wall,
        "gpus": gpus, "residues_per_gpu_hour": residues * 3600 / (wall * gpus), "fold_s": result.fold_seconds,
        "busy_fraction": busy, "idle_between_targets_fraction": idle_between_targets(frame),
    }  # fmt: skip


# -- OSS Boltz-2 -----------------------------------------------------------------------------------

def oss_command(inputs: Path, out: Path, args: argparse.Namespace, checkpoint: Path, gpus: int) -> list[str]:
    return [
        sys.executable, "-m", "boltz.main", "predict", str(inputs), "--out_dir", str(out),
        "--cache", str(args.boltz_cache), "--checkpoint", str(checkpoint), "--model", "boltz2",
        "--accelerator", "gpu" if args.device == "cuda" else "cpu", "--devices", str(gpus),
        "--recycling_steps", str(args.recycling_steps), "--sampling_steps", str(args.sampling_steps),
        "--diffusion_samples", str(args.diffusion_samples), "--max_parallel_samples", str(args.max_parallel_samples),
        "--seed", str(args.seed), "--override",
    ]  # fmt: skip


def run_oss(
    inputs: Path, out: Path, args: argparse.Namespace, checkpoint: Path, targets: list[SyntheticTarget], gpus: int
) -> dict[str, object]:
    command = oss_command(inputs, out, args, checkpoint, gpus)
    log.info("running %s", " ".join(command))
    started = time.monotonic()
    with open(out.parent / "oss.log", "w", encoding="utf-8") as handle:
        done = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, check=False)
    wall = time.monotonic() - started
    predictions = out / f"boltz_results_{inputs.name}" / "predictions"
    written = [t for t in targets if (predictions / t.target_id / f"{t.target_id}_model_0.cif").exists()]
    if done.returncode != 0:
        log.warning("boltz predict exited with %d (see %s)", done.returncode, out.parent / "oss.log")
    residues = sum(t.residues for t in written)
    return {
        "system": "oss-boltz2", "targets": len(targets), "written": len(written), "residues": residues,
        "wall_s": wall, "gpus": gpus, "residues_per_gpu_hour": residues * 3600 / (wall * gpus),
    }  # fmt: skip


# -- cross-target batching ------------------------------------------------------------------------

def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def batching_probe(model: ModelSettings, lengths: list[int], batch_size: int, seed: int) -> pd.DataFrame:
    """Seconds for `batch_size` targets of each length: one forward each vs one stacked forward."""
    engine = Engine(model)
    rng = np.random.default_rng(seed)
    rows = []
    for length in lengths:
        featurized = [
            featurize(Target(f"probe{i}", (Entity("protein", ("A",), "".join(rng.choice(AMINO_ACIDS, size=length)), msa="empty"),)))
            for i in range(batch_size)
        ]
        singles = [{k: v.to(engine.device) for k, v in item.features.items()} for item in featurized]
        batch = {k: v.to(engine.device) for k, v in stack_featurized(featurized).items()}
        timings = {}
        for name, run_forwards in (
            ("one_by_one", lambda: [engine.model.predict(features, engine.recipe) for features in singles]),
            ("batched", lambda: engine.model.predict(batch, engine.recipe)),
        ):
            with torch.inference_mode():
                run_forwards()  # warm-up (allocator, kernels, autotuning)
                _synchronize(engine.device)
                started = time.perf_counter()
                run_forwards()
                _synchronize(engine.device)
            timings[name] = time.perf_counter() - started
        rows.append({"tokens": length, "targets": batch_size, "one_by_one_s": timings["one_by_one"],
                     "batched_s": timings["batched"], "speedup": timings["one_by_one"] / timings["batched"]})  # fmt: skip
    return pd.DataFrame(rows)


# -- planning and queueing only -----------------------------------------------------------------

class PassThrough:
    """A stage that hands its input on: the executor's own cost, without featurizer or model."""

    token_budget = 1 << 30

    def __call__(self, payload: object) -> object:
        return payload


def _rss_mb() -> float:
    with open("/proc/self/statm", encoding="ascii") as handle:
        return int(handle.read().split()[1]) * 4096 / 2**20


def plan_only(targets: list[SyntheticTarget], out: Path, seed: int) -> dict[str, object]:
    """Worklist rows -> shards -> plan -> every target through Ray's pools and queues; time and memory."""
    started = time.monotonic()
    rows = [
        summarize(Target(t.target_id, tuple(Entity("protein", (c,), s, msa="empty") for c, s in zip("AB", t.sequences))))
        for t in targets
    ]
    table = pd.DataFrame(rows)
    shards = plan_shards(table, tokens_per_shard=200_000, max_shards=100)
    items = work_items(table)
    plan = plan_run(items, out, {"model": "plan-only", "seed": seed})
    planned = time.monotonic()
    memory: list[float] = []  # driver RSS, sampled every 500 targets
    settings = ExecutorSettings(cpu_workers=1, cpu_replicas=1)
    with ray_session(settings):
        pools = start_pools(settings, "cpu", PassThrough, PassThrough, PassThrough, f"plan{seed}")
        try:
            queued = time.monotonic()
            memory.append(_rss_mb())
            done = [0]

            def sample_memory(record: object) -> None:
                done[0] += 1
                if done[0] % 500 == 0:
                    memory.append(_rss_mb())

            scheduler = Scheduler(pools, plan.todo, settings.queue_depth, settings.max_attempts, sample_memory)
            scheduler.run()
            memory.append(_rss_mb())
        finally:
            stop_pools(pools)
    finished = time.monotonic()
    return {
        "targets": len(targets), "shards": len(shards), "plan_s": planned - started, "queue_s": finished - queued,
        "total_s": finished - started, "targets_per_s": len(targets) / (finished - queued),
        "peak_featurized": scheduler.peak_featurized, "queue_bound": settings.queue_depth,
        "driver_rss_start_mb": memory[0], "driver_rss_peak_mb": max(memory), "driver_rss_end_mb": memory[-1],
    }  # fmt: skip


# -- the command ------------------------------------------------------------------------------------

def run(args: argparse.Namespace) -> int:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    if args.batching:
        lengths = [int(value) for value in args.batch_lengths.split(",")]
        table = batching_probe(model_settings_for(args), lengths, args.batch_size, args.seed)
        with atomic_path(out / "batching.tsv") as tmp:
            table.to_csv(tmp, sep="\t", index=False, float_format="%.4f")
        print(markdown_table(table))
        return 0
    worklist = synthetic_worklist(args.targets, args.seed, args.min_length, args.max_length)
    if args.plan_only:
        row = plan_only(worklist, out, args.seed)
        with atomic_path(out / "plan_only.tsv") as tmp:
            pd.DataFrame([row]).to_csv(tmp, sep="\t", index=False, float_format="%.3f")
        print(pd.DataFrame([row]).T.to_string(header=False))
        return 0
    checkpoint = None
    if args.oss:
        if importlib.util.find_spec("boltz") is None:
            raise FoldmillError("--oss needs OSS Boltz-2 (`boltz`) importable in this environment")
        if args.boltz_cache is None or not (args.boltz_cache / "mols").is_dir():
            raise FoldmillError("--oss needs --boltz-cache: a Boltz cache directory holding mols/")
        architecture = demo_architecture(args.model)
        checkpoint = export_demo_checkpoint(architecture, out / f"{args.model}.ckpt") if architecture else Path(args.model)
    sample = sample_targets(worklist, args.sample, args.seed)
    inputs = write_inputs(sample, out / "inputs", args.msa_depth, args.seed)
    log.info("sample: %d of %d targets, %d residues", len(sample), len(worklist), sum(t.residues for t in sample))
    shutil.rmtree(out / "runs", ignore_errors=True)  # a rerun folds everything again, never resumes
    result, wall = run_foldmill(inputs, out / "runs" / "foldmill", model_settings_for(args, checkpoint), args.cpu_workers)
    frame = timeline(out / "runs" / "foldmill" / "fold" / "fold.tsv")
    with atomic_path(out / "timeline.tsv") as tmp:
        frame.to_csv(tmp, sep="\t", index=False, float_format="%.3f")
    rows = [foldmill_row(result, wall, frame, len(sample))]
    if checkpoint is not None:
        rows.append(run_oss(inputs, out / "runs" / "oss", args, checkpoint, sample, rows[0]["gpus"]))
        if rows[1]["residues"]:
            rows[0]["ratio_vs_oss"] = rows[0]["residues_per_gpu_hour"] / rows[1]["residues_per_gpu_hour"]
    table = pd.DataFrame(rows, columns=TABLE_COLUMNS)
    with atomic_path(out / "throughput.tsv") as tmp:
        table.to_csv(tmp, sep="\t", index=False, float_format="%.4f")
    report = report_text(args, table, result.summary)
    write_text_atomic(out / "throughput.md", report)
    print(report)
    return 0


def report_text(args: argparse.Namespace, table: pd.DataFrame, summary: str) -> str:
    recipe = f"{args.recycling_steps} recycles, {args.sampling_steps} steps, {args.diffusion_samples} samples"
    return "\n".join([
        "# foldmill bench throughput",
        "",
        f"Worklist: {args.targets} two-chain targets, {args.min_length}-{args.max_length} residues (seed {args.seed}), "
        f"sample {args.sample or args.targets}; MSA depth {args.msa_depth} per chain; model {args.model}; {recipe}.",
        "",
        markdown_table(table),
        "",
        "```",
        summary,
        "```",
        "",
    ])


def markdown_table(frame: pd.DataFrame) -> str:
    def cell(value: object) -> str:
        return f"{value:.3f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)
