"""`foldmill bench throughput`: residues folded per GPU-hour end to end, foldmill vs OSS Boltz-2.

The fixed worklist: `--targets` two-chain protein targets whose combined length is drawn uniformly
from [--min-length, --max-length] (seeded), each with a synthetic MSA of `--msa-depth` rows per
chain (A3M files), written as Boltz YAML inputs. A seeded `--sample` of it is what both sides fold,
with the anchor recipe (3 recycles, 200 sampling steps, 5 diffusion samples by default). The sample
is the first --sample targets of a seeded shuffle of the worklist, optionally only among those of
at most --sample-max-length residues (the worklist itself keeps its range; the cap only fits the
sample to the GPU time at hand); with --stratified, the first target of that shuffle in each of
--sample equal-width length strata instead, so that a few targets span the whole range:
  foldmill  worklist -> featurize -> fold -> written outputs, timed from reading the YAML files to
            the last written target (Ray and model start-up included);
  oss       `boltz predict` on the same YAML directory (with --oss, when `boltz` is importable). It
            needs --boltz-cache, a Boltz cache as `boltz predict` leaves it (mols/, and non-empty
            boltz2_conf.ckpt and boltz2_aff.ckpt, or it tries to download them). Both sides load the
            same weights: the --model checkpoint, or the demo's seeded weights exported to
            WORK_DIR/<model>.ckpt (passed to boltz as --checkpoint).
Residues per GPU-hour = residues of the targets written / (wall hours x GPUs). The foldmill row also
reports replica busy time and the idle gaps between targets; timeline.tsv has every target's
featurize, fold (start/end on its replica) and write times, oss_timeline.tsv when each OSS target
was written. foldmill runs first; OSS gets what is left of --time-budget (when set) and, stopped at
it, is measured up to its last written target. throughput.tsv is rewritten (atomically) as each
side finishes, so a run killed from outside still leaves the rows finished so far. `--side foldmill`
then `--side oss` (same arguments and --out) split the comparison over two invocations, say two
jobs of limited length: the second adds its row (and the ratio) beside the first's.

--batching measures cross-target batching before the executor uses it: for each length in
--batch-lengths, --batch-size targets folded one after another vs stacked into one forward of the
same model and recipe (writes batching.tsv; none of the anchor systems batches across targets).

--plan-only measures the executor without a model: a synthetic worklist of --targets targets is
sharded and planned, then pushed through the real Ray actor pools and bounded queues with
pass-through stages, recording time and the driver's memory (flat memory on 20,000 targets).

Writes OUT/throughput.tsv and OUT/throughput.md (and timeline.tsv, oss_timeline.tsv, oss.log);
the bulky inputs/, runs/ and the exported checkpoint go to --work-dir (default: OUT).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import logging
import math
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from foldmill.bench._out_dir import writes_only_its_own
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
from foldmill.bench._synthetic import AMINO_ACIDS, random_protein, synthetic_msa
from foldmill.runtime.sharding import plan_shards

log = logging.getLogger(__name__)

TABLE_COLUMNS = [
    "system", "targets", "written", "residues", "wall_s", "gpus", "residues_per_gpu_hour",
    "fold_s", "startup_s", "busy_fraction", "idle_between_targets_fraction", "timed_out", "ratio_vs_oss",
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
    parser.add_argument("-o", "--out", type=Path, default=Path("results/bench/throughput"), help="output directory")
    parser.add_argument("--targets", type=int, default=1000, help="size of the fixed worklist")
    parser.add_argument("--sample", type=int, default=0, help="targets of the worklist both sides fold (0 = all)")
    parser.add_argument("--sample-max-length", type=int, default=0,
                        help="sample only among targets of at most this many residues (0 = no cap)")
    parser.add_argument("--stratified", action="store_true",
                        help="sample one target per equal-width length stratum (--sample strata) instead of the first ones")
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
    parser.add_argument("--cpu-workers", type=int, default=4,
                        help="featurize actors and writers; OSS gets as many data loader workers and preprocessing threads")
    parser.add_argument("--queue-depth", type=int, default=4,
                        help="featurized targets kept ready per replica (deep MSAs take seconds to featurize)")
    parser.add_argument("--object-store-mb", type=int, default=0, help="object store of the local Ray instance (0 = Ray's default)")
    parser.add_argument("--time-budget", type=float, default=0.0,
                        help="seconds for the whole command; OSS is stopped when it runs out (0 = no limit)")
    parser.add_argument("--work-dir", type=Path, help="inputs, runs and the exported checkpoint (default: OUT)")
    parser.add_argument("--kernel-cache", type=Path,
                        help="compiled GPU kernels kept across runs (model.kernel_cache; default: the run's own, which "
                        "starts cold, so the first target pays the compilation)")
    parser.add_argument("--oss", action="store_true", help="also run `boltz predict` on the same sample")
    parser.add_argument("--side", choices=("both", "foldmill", "oss"), default="both",
                        help="with --oss, run only one side (same sample, inputs and weights), to split the comparison "
                        "over two invocations with the same --out: the second adds its row beside the first's")
    parser.add_argument("--boltz-cache", type=Path, help="Boltz cache with mols/ (for --oss)")
    parser.add_argument("--plan-only", action="store_true", help="no model: planning and queueing only")
    parser.add_argument("--batching", action="store_true", help="only measure batched vs one-by-one forwards")
    parser.add_argument("--batch-lengths", default="128,256,384", help="target lengths (tokens) for --batching")
    parser.add_argument("--batch-size", type=int, default=4, help="targets per batch for --batching")
    parser.set_defaults(handler=writes_only_its_own(run))


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
        chains = tuple(random_protein(n, rng) for n in (first, total - first))
        targets.append(SyntheticTarget(f"dimer_{index:05d}", chains))
    return targets


def sample_targets(
    targets: list[SyntheticTarget], size: int, seed: int, max_length: int = 0, stratified: bool = False
) -> list[SyntheticTarget]:
    """The first `size` targets of a seeded shuffle (among those of at most `max_length` residues when
    set), in worklist order; size 0 = every eligible target. `stratified`: instead the first target of
    that shuffle in each of `size` equal-width length strata of the eligible targets, so a small sample
    spans the whole range (a short one can draw mostly small or mostly large targets)."""
    order = np.random.default_rng(seed + 1).permutation(len(targets))
    chosen = [int(i) for i in order if not max_length or targets[i].residues <= max_length]
    if not chosen:
        raise FoldmillError(f"no target of the worklist has at most {max_length} residues (--sample-max-length)")
    if stratified and size > 0:
        lengths = [targets[i].residues for i in chosen]
        low, high = min(lengths), max(lengths) + 1
        strata: dict[int, int] = {}
        for index, length in zip(chosen, lengths):
            strata.setdefault((length - low) * size // (high - low), index)
        chosen = list(strata.values())
    elif size > 0:
        chosen = chosen[:size]
    return [targets[i] for i in sorted(chosen)]


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
    kernel_cache = str(args.kernel_cache or "")
    if checkpoint is not None or architecture is None:
        return ModelSettings(str(checkpoint or args.model), args.device, recipe, kernel_cache=kernel_cache)
    full = {f.name: getattr(architecture, f.name) for f in dataclasses.fields(Boltz2Config)}
    return ModelSettings("demo", args.device, recipe, demo_config=full, kernel_cache=kernel_cache)


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


def executor_settings_for(args: argparse.Namespace) -> ExecutorSettings:
    """The executor of the foldmill side: a local Ray instance with every visible GPU (counted by
    torch, so Ray's own GPU detection is not relied on), --cpu-workers featurizers and writers, and
    --queue-depth featurized targets ready per replica."""
    gpus = torch.cuda.device_count() if args.device == "cuda" else 0
    return ExecutorSettings(
        cpu_workers=args.cpu_workers, gpus=gpus, queue_depth=args.queue_depth, object_store_mb=args.object_store_mb
    )


def run_foldmill(inputs: Path, out: Path, model: ModelSettings, executor: ExecutorSettings) -> tuple[RunResult, float]:
    """Fold every YAML in `inputs`; (result, wall seconds from reading the inputs to the last write)."""
    started = time.monotonic()
    worklist = build_worklist([inputs])
    result = fold_targets(work_items(worklist.table), out, out / "fold" / "fold.tsv", model, executor, Staging())
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
        "startup_s": wall - result.fold_seconds, "busy_fraction": busy,
        "idle_between_targets_fraction": idle_between_targets(frame), "timed_out": False,
    }  # fmt: skip


# -- OSS Boltz-2 -----------------------------------------------------------------------------------

REQUIRED_CACHE_FILES = ("boltz2_conf.ckpt", "boltz2_aff.ckpt")  # `boltz predict` downloads them when missing or empty


def check_boltz_cache(cache: Path | None) -> Path:
    """The Boltz cache `boltz predict` runs offline with: mols/ and non-empty checkpoint files."""
    if cache is None or not (cache / "mols").is_dir():
        raise FoldmillError("--oss needs --boltz-cache: a Boltz cache directory holding mols/")
    for name in REQUIRED_CACHE_FILES:
        path = cache / name
        if not path.is_file() or path.stat().st_size == 0:
            raise FoldmillError(f"--boltz-cache {cache}: {name} is missing or empty, so boltz would try to download it")
    return cache


def oss_command(inputs: Path, out: Path, args: argparse.Namespace, checkpoint: Path, gpus: int) -> list[str]:
    """`boltz predict` with the same recipe, offline, on the same inputs: no MSA server, no steering
    potentials (the model under test has none), its cuEquivariance kernels on (no --no_kernels)."""
    workers = str(max(1, args.cpu_workers))
    return [
        sys.executable, "-m", "boltz.main", "predict", str(inputs), "--out_dir", str(out),
        "--cache", str(args.boltz_cache), "--checkpoint", str(checkpoint), "--model", "boltz2",
        "--accelerator", "gpu" if args.device == "cuda" else "cpu", "--devices", str(gpus),
        "--recycling_steps", str(args.recycling_steps), "--sampling_steps", str(args.sampling_steps),
        "--diffusion_samples", str(args.diffusion_samples), "--max_parallel_samples", str(args.max_parallel_samples),
        "--seed", str(args.seed), "--output_format", "mmcif", "--num_workers", workers,
        "--preprocessing-threads", workers, "--override",
    ]  # fmt: skip


def oss_timeline(out: Path, inputs: Path, targets: list[SyntheticTarget], started: float) -> pd.DataFrame:
    """When `boltz predict` finished its preprocessing and each target (its first model's mmCIF),
    in seconds from its start (`started`, Unix time), from the files' modification times."""
    results = out / f"boltz_results_{inputs.name}"
    rows = []
    manifest = results / "processed" / "manifest.json"
    if manifest.exists():
        rows.append({"target_id": "(preprocessing)", "residues": 0, "written_s": manifest.stat().st_mtime - started})
    for target in targets:
        model = results / "predictions" / target.target_id / f"{target.target_id}_model_0.cif"
        if model.exists():
            rows.append({"target_id": target.target_id, "residues": target.residues, "written_s": model.stat().st_mtime - started})
    return pd.DataFrame(rows, columns=["target_id", "residues", "written_s"]).sort_values("written_s").reset_index(drop=True)


def run_oss(
    inputs: Path, out: Path, args: argparse.Namespace, checkpoint: Path, targets: list[SyntheticTarget], gpus: int,
    timeout: float | None, log_path: Path,
) -> tuple[dict[str, object], pd.DataFrame]:
    """Run `boltz predict` (stopped after `timeout` seconds); its row and timeline. Stopped, it is
    measured up to its last written target, like foldmill (whose wall ends at its last write)."""
    command = oss_command(inputs, out, args, checkpoint, gpus)
    log.info("running %s", " ".join(command))
    started_unix, started = time.time(), time.monotonic()
    timed_out = False
    with open(log_path, "w", encoding="utf-8") as handle:
        try:
            done = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, check=False, timeout=timeout)
            if done.returncode != 0:
                log.warning("boltz predict exited with %d (see %s)", done.returncode, log_path)
        except subprocess.TimeoutExpired:
            timed_out = True
            log.warning("boltz predict stopped at the time budget (%.0f s)", timeout)
    wall = time.monotonic() - started
    frame = oss_timeline(out, inputs, targets, started_unix)
    written = frame[frame["residues"] > 0]
    if timed_out and len(written):
        wall = float(written["written_s"].max())
    residues = int(written["residues"].sum())
    row = {
        "system": "oss-boltz2", "targets": len(targets), "written": len(written), "residues": residues,
        "wall_s": wall, "gpus": gpus, "residues_per_gpu_hour": residues * 3600 / (wall * gpus), "timed_out": timed_out,
    }  # fmt: skip
    preprocessing = frame.loc[frame["target_id"] == "(preprocessing)", "written_s"]
    if len(preprocessing):
        row["startup_s"] = float(preprocessing.iloc[0])  # up to the end of its preprocessing (model load excluded)
    return row, frame


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
        "peak_featurized": scheduler.peak_featurized, "queue_bound": scheduler.featurized_bound,
        "driver_rss_start_mb": memory[0], "driver_rss_peak_mb": max(memory), "driver_rss_end_mb": memory[-1],
    }  # fmt: skip


# -- the command ------------------------------------------------------------------------------------

def _exit_on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM (`timeout`, Slurm) unwinds like an exception, so Ray's actors are stopped and a running
    `boltz predict` is killed by the cleanup on the way out, and the rows written so far stay."""
    raise SystemExit(128 + signum)


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    out: Path = args.out.resolve()  # Ray actors may run in another working directory
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
    work = (args.work_dir or out).resolve()
    work.mkdir(parents=True, exist_ok=True)
    if args.side != "both" and not args.oss:
        raise FoldmillError("--side splits the comparison with OSS: it needs --oss")
    run_foldmill_side = args.side in ("both", "foldmill")
    run_oss_side = args.oss and args.side in ("both", "oss")
    checkpoint = None
    if args.oss:
        if importlib.util.find_spec("boltz") is None:
            raise FoldmillError("--oss needs OSS Boltz-2 (`boltz`) importable in this environment")
        if args.model == "demo":
            raise FoldmillError("--oss needs the released architecture (--model demo-full or a checkpoint); OSS fixes some widths")
        if run_oss_side:
            args.boltz_cache = check_boltz_cache(args.boltz_cache).resolve()
        architecture = demo_architecture(args.model)
        checkpoint = export_demo_checkpoint(architecture, work / f"{args.model}.ckpt") if architecture else Path(args.model)
    sample = sample_targets(worklist, args.sample, args.seed, args.sample_max_length, args.stratified)
    inputs = write_inputs(sample, work / "inputs", args.msa_depth, args.seed)
    lengths = sorted(t.residues for t in sample)
    log.info("sample: %d of %d targets, %d residues (%s)", len(sample), len(worklist), sum(lengths), lengths)
    rows: list[dict[str, object]] = []
    summary = "the foldmill side failed: see the log above"
    if run_foldmill_side:
        shutil.rmtree(work / "runs" / "foldmill", ignore_errors=True)  # a rerun folds everything again, never resumes
        try:
            model, executor = model_settings_for(args, checkpoint), executor_settings_for(args)
            result, wall = run_foldmill(inputs, work / "runs" / "foldmill", model, executor)
            frame = timeline(work / "runs" / "foldmill" / "fold" / "fold.tsv")
            with atomic_path(out / "timeline.tsv") as tmp:
                frame.to_csv(tmp, sep="\t", index=False, float_format="%.3f")
            rows.append(foldmill_row(result, wall, frame, len(sample)))
            summary = result.summary
        except Exception:  # noqa: BLE001 - the OSS side is still worth measuring in the same run
            log.exception("the foldmill side failed")
    else:
        rows, summary = earlier_foldmill_row(out), "the foldmill side ran in an earlier invocation (--side foldmill)"
    report = write_report(out, args, rows, summary, sample)
    if run_oss_side:
        shutil.rmtree(work / "runs" / "oss", ignore_errors=True)
        timeout = None
        if args.time_budget:
            timeout = max(1.0, args.time_budget - (time.monotonic() - started))
        gpus = max(1, executor_settings_for(args).gpus)
        oss_row, oss_frame = run_oss(inputs, work / "runs" / "oss", args, checkpoint, sample, gpus, timeout, out / "oss.log")
        with atomic_path(out / "oss_timeline.tsv") as tmp:
            oss_frame.to_csv(tmp, sep="\t", index=False, float_format="%.3f")
        if rows and oss_row["residues"]:
            rows[0]["ratio_vs_oss"] = rows[0]["residues_per_gpu_hour"] / oss_row["residues_per_gpu_hour"]
        rows.append(oss_row)
        report = write_report(out, args, rows, summary, sample)
    print(report)
    if not run_foldmill_side:
        return 0 if rows and rows[-1]["system"] == "oss-boltz2" and rows[-1]["written"] else 1
    return 0 if rows and rows[0]["system"] == "foldmill" else 1


def earlier_foldmill_row(out: Path) -> list[dict[str, object]]:
    """The foldmill row an earlier `--side foldmill` invocation left in OUT/throughput.tsv (none if absent)."""
    table = out / "throughput.tsv"
    if not table.exists():
        log.warning("%s has no foldmill row yet: run --side foldmill with the same --out first for the ratio", table)
        return []
    frame = pd.read_csv(table, sep="\t")
    return frame[frame["system"] == "foldmill"].drop(columns="ratio_vs_oss").to_dict("records")


def write_report(
    out: Path, args: argparse.Namespace, rows: list[dict[str, object]], summary: str, sample: list[SyntheticTarget]
) -> str:
    """(Re)write throughput.tsv and throughput.md with the rows finished so far; the report text."""
    table = pd.DataFrame(rows, columns=TABLE_COLUMNS)
    with atomic_path(out / "throughput.tsv") as tmp:
        table.to_csv(tmp, sep="\t", index=False, float_format="%.4f")
    report = report_text(args, table, summary, sample)
    write_text_atomic(out / "throughput.md", report)
    return report


def report_text(args: argparse.Namespace, table: pd.DataFrame, summary: str, sample: list[SyntheticTarget]) -> str:
    recipe = f"{args.recycling_steps} recycles, {args.sampling_steps} steps, {args.diffusion_samples} samples"
    cap = f" of at most {args.sample_max_length} residues" if args.sample_max_length else ""
    cap += ", one per length stratum" if args.stratified else ""
    lengths = ", ".join(str(t.residues) for t in sorted(sample, key=lambda t: t.residues))
    return "\n".join([
        "# foldmill bench throughput",
        "",
        f"Worklist: {args.targets} two-chain targets, {args.min_length}-{args.max_length} residues (seed {args.seed}); "
        f"sample: {len(sample)} targets{cap} ({lengths} residues); MSA depth {args.msa_depth} per chain; "
        f"model {args.model}; {recipe}; device {args.device}.",
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
