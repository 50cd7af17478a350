"""`foldmill bench forward`: Boltz-2 model forward, OSS Boltz-2 (eager, torch.compile) vs foldmill's fast path.

The same weights for every contender (seeded random ones, OSS's state_dict loaded strictly into
foldmill's Boltz2; or `--checkpoint`'s, the released ones say) and the same feature dicts
(foldmill.features on synthetic proteins, see foldmill.bench._inputs).
Per input and contender: one warm-up call, then one GPU-synchronised forward is timed (model
forward only: features already on the GPU, outputs left there).

Contenders:
  oss-eager     OSS as `boltz predict` runs it: bf16 autocast, cuEquivariance kernels, inference
                mode, confidence one sample at a time (diffusion and confidence as OSS decides)
  oss-compile   the same after OSS's compile flags (in effect: its score model compiled), compiled afresh
                for every input
  foldmill      foldmill.fastpath.runner.FastBoltz2 with default options
  foldmill-bf16z  foldmill with the trunk's s/z residual stream stored in bf16 (default: fp32)
  foldmill-eager, foldmill-nokernels   ablations: no CUDA graphs / reference ops only

Peak memory = the timed call's peak allocation minus what other contenders hold: everything the
contender holds on the GPU counts (its weights, CUDA-graph pools, caches made by the warm-up),
where its fp32 master weights stay counts too (foldmill's model stays in host memory, its runner
holds the bf16 copies; OSS holds fp32 weights on the GPU). Per stage, the peak within it likewise
(`stage_peak_gib`). Stage seconds come from CUDA events at module boundaries (embedding,
templates, msa, pairformer, conditioning, diffusion, confidence).
Accuracy: foldmill bf16 vs foldmill fp32 (kernels off) on one input with the same seed:
per-sample coordinate RMSD after rigid alignment (<= 0.5 A) and pLDDT (complex and per token,
<= 0.02); also the bf16 residual stream, fp32 trunk + bf16 score model (which separates the two
precision choices), and, when OSS runs, OSS's own drift (its bf16 autocast vs its fp32, same
seed and weights): the yardstick for a randomly initialised, chaotic 64-block trunk.
Writes forward_bench.json, forward_bench.md, forward_bench.tsv and speedup.png to --out,
after every measurement (a run cut short keeps what it measured).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import platform
import time
import traceback
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from foldmill import kernels
from foldmill.bench._inputs import get_features, parse_inputs
from foldmill.bench._out_dir import writes_only_its_own
from foldmill.errors import FoldmillError
from foldmill.fastpath.runner import FastBoltz2, FastPathOptions
from foldmill.io.atomic import write_text_atomic
from foldmill.model import Boltz2, Boltz2Config, InferenceRecipe
from foldmill.model.diffusion import weighted_rigid_align

# The default protocol: >= 9 inputs from ~30 to ~1,700 tokens, monomers and dimers.
DEFAULT_INPUTS = "32,2x48@256,150,2x150@256,300,2x300@256,600,1000,2x600@256,1700"
CONTENDERS = ("oss-eager", "oss-compile", "foldmill", "foldmill-bf16z", "foldmill-eager", "foldmill-nokernels")
FOLDMILL_OPTIONS = {
    "foldmill": {},
    "foldmill-bf16z": {"trunk_residual": "bf16"},
    "foldmill-eager": {"cuda_graphs": False},
    "foldmill-nokernels": {"kernels": False},
}
STAGE_MODULES = {
    "embedding": "input_embedder",
    "templates": "template_module",
    "msa": "msa_module",
    "pairformer": "pairformer_module",
    "conditioning": "diffusion_conditioning",
    "confidence": "confidence_module",
}
RMSD_LIMIT = 0.5  # A
PLDDT_LIMIT = 0.02


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("forward", help="Boltz-2 forward: OSS Boltz-2 (eager, compile) vs foldmill (GPU)")
    parser.add_argument("--inputs", default=DEFAULT_INPUTS, help="LENGTHS[@MSA_DEPTH],... (see foldmill.bench._inputs)")
    parser.add_argument("--features", help="directory of prepared inputs; missing ones are featurized into it")
    parser.add_argument(
        "--prepare", action="store_true", help="only featurize --inputs into --features (CPU), then exit"
    )
    parser.add_argument("--contenders", default="oss-eager,oss-compile,foldmill", help=f"comma-separated: {CONTENDERS}")
    parser.add_argument("--recycles", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--max-parallel", type=int, default=5)
    parser.add_argument(
        "--warmup",
        choices=("full", "short", "none"),
        default="full",
        help="warm-up call: the measured recipe, 0 recycles and 2 steps (same shapes), or none (the timed call "
        "then includes autotuning and graph capture: for a single large input that must only complete)",
    )
    parser.add_argument("--accuracy", default="first", help="input for the bf16-vs-fp32 check: first, NAME or none")
    parser.add_argument("--config", choices=("released", "small"), default="released", help="model architecture")
    parser.add_argument(
        "--checkpoint",
        help="Boltz-2 weights (boltz2_conf.ckpt, a state_dict or .safetensors) for every contender, instead of seeded "
        "random ones; the architecture is then the checkpoint's (--config is ignored). With trained weights the "
        "bf16-vs-fp32 check measures rounding, not the chaos of a random network",
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--time-budget", type=float, default=0.0, help="seconds; later measurements are skipped (0 = none)"
    )
    parser.add_argument("--out", default="results/bench/forward", help="output directory")
    parser.set_defaults(handler=writes_only_its_own(run))


# Timing


class StageTimer:
    """Seconds spent in a Boltz-2 model's stages (OSS and foldmill share module names)."""

    def __init__(self, model: nn.Module, sampler: Any = None) -> None:
        """sampler: what draws the diffusion samples through its `sample` (default: the model's
        structure module; FastBoltz2 samples itself)."""
        self.model = model
        self.sampler = sampler if sampler is not None else model.structure_module
        self.events: dict[str, list[tuple[Any, Any]]] = defaultdict(list)
        self.cuda = next(model.parameters()).is_cuda
        self.peak_bytes: dict[str, int] = {}  # stage (or "between" stages) -> its peak allocation

    def _peak_so_far(self, stage: str) -> None:
        """Book the allocator's peak since the last boundary to `stage`, and start a new one. The
        allocator decides on the host, when work is queued, so no synchronisation is needed."""
        if self.cuda:
            self.peak_bytes[stage] = max(self.peak_bytes.get(stage, 0), torch.cuda.max_memory_allocated())
            torch.cuda.reset_peak_memory_stats()

    def _now(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    @contextmanager
    def recording(self) -> Iterator[StageTimer]:
        handles, started = [], {}
        for stage, attribute in STAGE_MODULES.items():
            module = getattr(self.model, attribute, None)
            if module is None:
                continue
            module = getattr(module, "_orig_mod", module)  # OSS runs compiled trunk modules' originals

            def pre(_module: nn.Module, _args: Any, stage: str = stage) -> None:
                self._peak_so_far("between")
                started[stage] = self._now()

            def post(_module: nn.Module, _args: Any, _out: Any, stage: str = stage) -> None:
                self._peak_so_far(stage)
                self.events[stage].append((started.pop(stage), self._now()))

            handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
        sampler = self.sampler
        sample = sampler.sample

        def timed_sample(*args: Any, **kwargs: Any) -> Any:
            self._peak_so_far("between")
            start = self._now()
            out = sample(*args, **kwargs)
            self._peak_so_far("diffusion")
            self.events["diffusion"].append((start, self._now()))
            return out

        sampler.sample = timed_sample
        try:
            yield self
        finally:
            self._peak_so_far("between")
            del sampler.sample
            for handle in handles:
                handle.remove()

    def seconds(self) -> dict[str, float]:
        if self.cuda:
            torch.cuda.synchronize()
        elapsed = (lambda a, b: a.elapsed_time(b) / 1000) if self.cuda else (lambda a, b: b - a)
        return {stage: round(sum(elapsed(a, b) for a, b in pairs), 4) for stage, pairs in self.events.items()}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_bytes(module: nn.Module, device: torch.device) -> int:
    """Bytes of `module`'s parameters and buffers on `device` (shared tensors counted once)."""
    seen, total = set(), 0
    for tensor in [*module.parameters(), *module.buffers()]:
        # torch.device("cuda") != torch.device("cuda:0"): compare the type, and the index when given
        on_device = tensor.device.type == device.type and device.index in (None, tensor.device.index)
        if on_device and tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            total += tensor.numel() * tensor.element_size()
    return total


def others_bytes(device: torch.device, own_bytes: int = 0) -> int:
    """What is allocated on `device` now, less `own_bytes`: the baseline a contender's peak is taken over."""
    if device.type != "cuda":
        return 0
    gc.collect()  # a previous contender's runner (reference cycles) must not count against this one
    torch.cuda.empty_cache()
    return torch.cuda.memory_allocated(device) - own_bytes


def measure(
    call: Callable[[bool], Any], timer: StageTimer, device: torch.device, baseline: int, warm_up: bool = True
) -> dict[str, Any]:
    """Warm-up call(True) (if `warm_up`), then one timed call(False): seconds, peak GiB
    above `baseline` (overall and per stage), stage seconds, and whether the coordinates and pLDDT came
    out finite (a fast kernel's non-finite output must not pass as fast)."""
    if warm_up:
        call(True)
        _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    with timer.recording():
        out = call(False)
        _sync(device)
    seconds = time.perf_counter() - start
    row: dict[str, Any] = {"seconds": round(seconds, 3), "stages": timer.seconds()}
    row["finite"] = all(bool(torch.isfinite(out[name].float()).all()) for name in ("sample_atom_coords", "plddt"))
    if device.type == "cuda":
        stage_peaks = {stage: (peak - baseline) / 2**30 for stage, peak in timer.peak_bytes.items()}
        row["peak_gib"] = round(max(stage_peaks.values()), 2)
        row["stage_peak_gib"] = {stage: round(peak, 2) for stage, peak in stage_peaks.items()}
    return row


# Accuracy


def coordinate_rmsd(coords: Tensor, reference: Tensor, atom_mask: Tensor) -> Tensor:
    """Per-sample RMSD (A) of coords (S, N, 3) to reference (S, N, 3) after rigid alignment over masked atoms."""
    mask = atom_mask.float().expand(coords.shape[0], -1)
    aligned = weighted_rigid_align(coords.float(), reference.float(), mask, mask)
    squared = ((aligned - reference.float()) ** 2).sum(-1)
    return torch.sqrt((squared * mask).sum(-1) / mask.sum(-1))


def radius_of_gyration(coords: Tensor, atom_mask: Tensor) -> Tensor:
    """Per-sample radius of gyration (A) over masked atoms: the scale an RMSD is judged against."""
    atoms = coords[:, atom_mask.bool()]
    return ((atoms - atoms.mean(1, keepdim=True)) ** 2).sum(-1).mean(-1).sqrt()


def drift(out: dict[str, Tensor], reference: dict[str, Tensor], atom_mask: Tensor) -> dict[str, Any]:
    """How far one prediction is from a reference of the same input and seed (coordinates and pLDDT)."""
    rmsd = coordinate_rmsd(out["sample_atom_coords"].float(), reference["sample_atom_coords"].float(), atom_mask)
    complex_plddt = (out["complex_plddt"].float() - reference["complex_plddt"].float()).abs()
    token_plddt = (out["plddt"].float() - reference["plddt"].float()).abs()
    check = {
        "rmsd_per_sample": [round(v, 4) for v in rmsd.tolist()],
        "rmsd_max": round(rmsd.max().item(), 4),
        "complex_plddt_diff_max": round(complex_plddt.max().item(), 5),
        "token_plddt_diff_mean": round(token_plddt.mean().item(), 5),
        "token_plddt_diff_max": round(token_plddt.max().item(), 5),
        "trunk_s_relative_diff": round(((out["s"].float() - reference["s"]).norm() / reference["s"].norm()).item(), 5),
    }
    check["passed"] = check["rmsd_max"] <= RMSD_LIMIT and check["complex_plddt_diff_max"] <= PLDDT_LIMIT
    return check


def accuracy_check(
    model: Boltz2, feats: dict[str, Tensor], recipe: InferenceRecipe, oss: Any = None
) -> dict[str, Any]:
    """foldmill's bf16 variants against fp32, same seed; with `oss`, OSS bf16 against OSS fp32 too."""
    device = feats["token_pad_mask"].device
    reference = FastBoltz2(model, FastPathOptions(precision="fp32", kernels=False), device).predict(feats, recipe)
    atom_mask = feats["atom_pad_mask"][0]
    result: dict[str, Any] = {
        "reference_radius_of_gyration": [
            round(v, 2) for v in radius_of_gyration(reference["sample_atom_coords"], atom_mask).tolist()
        ],
        "limits": {"rmsd": RMSD_LIMIT, "plddt": PLDDT_LIMIT},
    }
    variants = {
        "bf16": FastPathOptions(),
        "bf16_residual": FastPathOptions(trunk_residual="bf16"),
        "fp32_trunk_bf16_score": FastPathOptions(precision="fp32", score_precision="bf16"),
    }
    for name, options in variants.items():
        result[name] = drift(FastBoltz2(model, options, device).predict(feats, recipe), reference, atom_mask)
    if oss is not None:
        from foldmill.bench._oss_reference import oss_predict

        steps = (recipe.recycling_steps, recipe.sampling_steps, recipe.diffusion_samples, recipe.max_parallel_samples)
        try:  # a failure here must not lose foldmill's rows above
            oss_fp32 = oss_predict(oss, feats, *steps, recipe.seed or 0, autocast=False)
            oss_bf16 = oss_predict(oss, feats, *steps, recipe.seed or 0, autocast=True)
            result["oss_bf16_vs_oss_fp32"] = drift(oss_bf16, oss_fp32, atom_mask)
        except Exception as error:  # noqa: BLE001
            result["oss_bf16_vs_oss_fp32"] = {"error": f"{type(error).__name__}: {error}"}
    result["passed"] = result["bf16"]["passed"]
    return result


# Reporting


def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v and v > 0]
    return round(math.exp(sum(map(math.log, values)) / len(values)), 3) if values else None


def speedups(rows: list[dict[str, Any]], baseline: str) -> dict[str, float]:
    by_input: dict[str, dict[str, dict]] = defaultdict(dict)
    for row in rows:
        by_input[row["input"]][row["contender"]] = row
    out = {}
    for name, per in by_input.items():
        if baseline in per and "foldmill" in per and "seconds" in per[baseline] and "seconds" in per["foldmill"]:
            out[name] = round(per[baseline]["seconds"] / per["foldmill"]["seconds"], 3)
    return out


def markdown_report(payload: dict[str, Any]) -> str:
    rows = payload["rows"]
    lines = [
        f"Device: {payload['device']}; torch {payload['torch']}; recipe {payload['recipe']}; warm-up {payload['warmup']}",
        "",
        "| input | kind | tokens | contender | seconds | peak GiB | stages (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        stages = ", ".join(f"{k} {v:.2f}" for k, v in row.get("stages", {}).items())
        seconds = row.get("seconds", row.get("status", ""))
        lines.append(
            f"| {row['input']} | {row['kind']} | {row['tokens']} | {row['contender']} | {seconds} | "
            f"{row.get('peak_gib', '')} | {stages} |"
        )
    lines.append("")
    for baseline, summary in payload["summary"].items():
        lines.append(f"foldmill vs {baseline}: per input {summary['per_input']}, geomean {summary['geomean']}")
    if payload.get("accuracy"):
        lines.append(f"accuracy (bf16 vs fp32): {json.dumps(payload['accuracy'])}")
    return "\n".join(lines) + "\n"


def tsv_report(rows: list[dict[str, Any]]) -> str:
    header = ["input", "kind", "tokens", "contender", "seconds", "peak_gib", "status"]
    lines = ["\t".join(header)] + ["\t".join(str(row.get(k, "")) for k in header) for row in rows]
    return "\n".join(lines) + "\n"


def plot_speedups(payload: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    tokens = {row["input"]: row["tokens"] for row in payload["rows"]}
    figure, axes = plt.subplots(figsize=(6, 4))
    for baseline, summary in payload["summary"].items():
        points = sorted((tokens[name], value) for name, value in summary["per_input"].items())
        if points:
            axes.plot(*zip(*points), marker="o", label=f"vs {baseline} (geomean {summary['geomean']})")
    axes.axhline(1.0, color="grey", linewidth=0.8)
    axes.set_xlabel("tokens")
    axes.set_ylabel("foldmill speedup")
    axes.set_title(f"Boltz-2 forward, {payload['device']}")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


# Run


@dataclasses.dataclass
class _Models:
    """The contenders' models, built on first use with the same weights: a checkpoint's, else seeded random ones."""

    config: Boltz2Config
    device: torch.device
    seed: int
    checkpoint: str | None = None
    oss: Any = None
    ours: Boltz2 | None = None
    compiled: bool = False

    def __post_init__(self) -> None:
        if self.checkpoint is not None:
            self.ours = Boltz2.from_checkpoint(self.checkpoint).eval()
            self.config = self.ours.config

    def oss_model(self) -> Any:
        if self.oss is None:
            from foldmill.bench._oss_reference import oss_boltz2

            try:
                oss = oss_boltz2(self.config, self.seed, self.device, use_kernels=self.device.type == "cuda")
            except ImportError as error:
                raise FoldmillError(f"OSS Boltz-2 (boltz-community) is not importable: {error}") from error
            if self.checkpoint is not None:  # loaded into `ours` at construction; its names are OSS's own
                oss.load_state_dict(self.foldmill_model(with_oss_weights=False).state_dict(), strict=True)
            self.oss = oss
        return self.oss

    def foldmill_model(self, with_oss_weights: bool) -> Boltz2:
        """foldmill's fp32 model, in host memory: FastBoltz2 copies what it runs to the device."""
        if self.ours is None:
            ours = Boltz2(self.config)
            if with_oss_weights:
                # OSS's compiled modules hold their originals as `_orig_mod`: the same parameters.
                weights = {k.replace("_orig_mod.", ""): v for k, v in self.oss_model().state_dict().items()}
                ours.load_state_dict(weights, strict=True)
            else:
                from foldmill.model.demo import randomize_weights

                randomize_weights(ours, self.seed)
            self.ours = ours.eval()
        return self.ours


def run(args: argparse.Namespace) -> int:
    inputs = parse_inputs(args.inputs)
    features_dir = Path(args.features) if args.features else None
    if args.prepare:
        if features_dir is None:
            raise FoldmillError("--prepare needs --features DIR")
        features_dir.mkdir(parents=True, exist_ok=True)
        for item in inputs:
            get_features(item, features_dir, "cpu")
            print(f"prepared {item.name} ({item.tokens} tokens)")
        return 0
    contenders = [c for c in args.contenders.split(",") if c]
    unknown = set(contenders) - set(CONTENDERS)
    if unknown:
        raise FoldmillError(f"unknown contenders {sorted(unknown)}; known: {CONTENDERS}")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise FoldmillError("foldmill bench forward --device cuda needs a CUDA GPU (use --device cpu --config small)")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = Boltz2Config() if args.config == "released" else Boltz2Config.small()
    recipe = InferenceRecipe(args.recycles, args.steps, args.samples, args.max_parallel, seed=args.seed)
    warm_recipe = None if args.warmup == "none" else recipe
    if args.warmup == "short":
        warm_recipe = dataclasses.replace(recipe, recycling_steps=0, sampling_steps=2)
    models = _Models(config, device, args.seed, args.checkpoint)
    uses_oss = any(c.startswith("oss") for c in contenders)
    on_cuda = device.type == "cuda"
    started = time.perf_counter()
    payload: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if on_cuda else platform.processor() or "cpu",
        "torch": torch.__version__,
        "config": args.config if args.checkpoint is None else "checkpoint",
        "weights": dict(models.ours.provenance) if args.checkpoint else {"model": "random", "seed": args.seed},
        "recipe": dataclasses.asdict(recipe),
        "warmup": args.warmup,
        "rows": [],
        "summary": {},
        "accuracy": None,
        "kernels": {},
    }

    def save() -> None:
        payload["summary"] = {
            baseline: {"per_input": per, "geomean": geomean(list(per.values()))}
            for baseline in ("oss-eager", "oss-compile")
            if (per := speedups(payload["rows"], baseline))
        }
        payload["elapsed_seconds"] = round(time.perf_counter() - started, 1)
        write_text_atomic(out_dir / "forward_bench.json", json.dumps(payload, indent=1) + "\n")
        write_text_atomic(out_dir / "forward_bench.md", markdown_report(payload))
        write_text_atomic(out_dir / "forward_bench.tsv", tsv_report(payload["rows"]))
        if payload["summary"]:
            plot_speedups(payload, out_dir / "speedup.png")

    def over_budget() -> bool:
        return bool(args.time_budget) and time.perf_counter() - started > args.time_budget

    accuracy_input = (
        None if args.accuracy == "none" else (inputs[0].name if args.accuracy == "first" else args.accuracy)
    )
    for item in inputs:
        feats = get_features(item, features_dir, device)
        for contender in contenders:
            row: dict[str, Any] = {"input": item.name, "kind": item.kind, "tokens": item.tokens, "contender": contender}
            payload["rows"].append(row)
            if over_budget():
                row["status"] = "skipped (time budget)"
                continue
            try:
                row.update(_measure_contender(contender, models, feats, recipe, warm_recipe, uses_oss, on_cuda))
                row["status"] = "ok"
            except torch.OutOfMemoryError:
                row["status"] = "OOM"
                torch.cuda.empty_cache()
            except Exception as error:  # noqa: BLE001 - one failing contender must not end the benchmark
                row["status"] = f"error: {type(error).__name__}: {error}"
                traceback.print_exc()
            print(json.dumps(row), flush=True)
            save()
        if item.name == accuracy_input and not over_budget():
            try:
                ours = models.foldmill_model(with_oss_weights=uses_oss)
                oss = models.oss_model() if uses_oss else None
                payload["accuracy"] = {"input": item.name, **accuracy_check(ours, feats, recipe, oss)}
            except Exception as error:  # noqa: BLE001
                payload["accuracy"] = {"input": item.name, "error": f"{type(error).__name__}: {error}"}
                traceback.print_exc()
            print(json.dumps({"accuracy": payload["accuracy"]}), flush=True)
            save()
        del feats
    payload["kernels"] = {"retired": kernels.retired_backends()}
    save()
    print(markdown_report(payload))
    return 0


def _measure_contender(
    contender: str,
    models: _Models,
    feats: dict[str, Tensor],
    recipe: InferenceRecipe,
    warm_recipe: InferenceRecipe | None,
    uses_oss: bool,
    on_cuda: bool,
) -> dict[str, Any]:
    if contender.startswith("oss"):
        from foldmill.bench._oss_reference import compile_like_oss, oss_predict

        oss = models.oss_model()
        if contender == "oss-compile":
            if not models.compiled:
                compile_like_oss(oss)
                models.compiled = True
            # Every input compiles afresh, as `boltz predict` on it in a new process would: the shapes of
            # earlier inputs otherwise use up dynamo's recompile limit and the compiled modules fall back
            # to eager.
            torch._dynamo.reset()

        def call(warm: bool) -> Any:
            r = warm_recipe if warm and warm_recipe else recipe
            return oss_predict(
                oss,
                feats,
                r.recycling_steps,
                r.sampling_steps,
                r.diffusion_samples,
                r.max_parallel_samples,
                r.seed or 0,
                autocast=on_cuda,
            )

        baseline = others_bytes(models.device, device_bytes(oss, models.device))
        return measure(call, StageTimer(oss), models.device, baseline, warm_up=warm_recipe is not None)

    ours = models.foldmill_model(with_oss_weights=uses_oss)
    options = FastPathOptions(**FOLDMILL_OPTIONS[contender], **({} if on_cuda else {"precision": "fp32"}))
    baseline = others_bytes(models.device)
    fast = FastBoltz2(ours, options, device=models.device)
    kernels.reset_counts()

    def call(warm: bool) -> Any:
        if not warm:
            kernels.reset_counts()
        return fast.predict(feats, warm_recipe if warm and warm_recipe else recipe)

    timer = StageTimer(fast.network, sampler=fast)
    row = measure(call, timer, models.device, baseline, warm_up=warm_recipe is not None)
    row["kernel_calls"] = kernels.chosen_counts()
    row["graphs"] = {
        "captures": fast.graphs.captures,
        "replays": fast.graphs.replays,
        "eager": fast.graphs.eager_reasons,
    }
    trunk_graphs = getattr(fast.network.pairformer_module, "graphs", None)  # FastBoltz2's GraphedPairformer
    if trunk_graphs is not None:
        row["trunk_graphs"] = {
            "captures": trunk_graphs.captures,
            "replays": trunk_graphs.replays,
            "eager": trunk_graphs.eager_reasons,
        }
    return row


if __name__ == "__main__":
    from foldmill.bench._standalone import main

    raise SystemExit(main(register))
