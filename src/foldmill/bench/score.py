"""`foldmill bench score`: one diffusion step's score model, the reference module vs foldmill's
restructured one (foldmill.fastpath.score), on the GPU.

Per input (synthetic proteins, foldmill.bench._inputs; random trunk outputs and released-architecture
random weights: timings do not depend on the values), with `--samples` samples in one batch:
- milliseconds per score-model call, median of `--repeats`, eager and replayed from a CUDA graph, for
  the module (bf16 copy of DiffusionModule with the routed kernels, no restructuring) and the
  restructured model;
- the restructured model's relative error against the reference (both bf16) and against fp32;
- milliseconds per whole sampling step (FastBoltz2.sample, graphed steps), from the difference of
  two sampling runs of different lengths, and which ops of a run synchronise with the host;
- with `--profile`, the restructured eager call's kernels by GPU time (profile_<input>.txt).
Writes score_bench.json and score_bench.md to --out.
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

from foldmill import kernels
from foldmill.bench._inputs import get_features, parse_inputs
from foldmill.bench._kernel_table import relative_error as kernel_relative_error
from foldmill.bench._out_dir import writes_only_its_own
from foldmill.errors import FoldmillError
from foldmill.fastpath.cuda_graphs import GraphedCall
from foldmill.fastpath.padding import pad_token_features
from foldmill.fastpath.runner import FastBoltz2, FastPathOptions
from foldmill.io.atomic import write_text_atomic
from foldmill.model import Boltz2, Boltz2Config, InferenceRecipe
from foldmill.runtime.timing import cuda_median_ms


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("score", help="diffusion score model per step: reference vs restructured (GPU)")
    parser.add_argument("--inputs", default="150,400,700,1000", help="LENGTHS[@MSA_DEPTH],... (foldmill.bench._inputs)")
    parser.add_argument("--features", help="directory of prepared inputs; missing ones are featurized into it")
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--profile", action="store_true", help="write the restructured call's kernel table per input")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="results/bench/score", help="output directory")
    parser.set_defaults(handler=writes_only_its_own(run))


def milliseconds(call: Callable[[], Any], repeats: int) -> float:
    """Median GPU milliseconds of `call` after two warm-up calls."""
    return round(cuda_median_ms(call, repeats, warmup=2), 3)


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    return round(kernel_relative_error(value, reference), 6)


def _trunk_like(model: Boltz2, feats: dict[str, torch.Tensor], generator: torch.Generator) -> Any:
    """Random trunk outputs of the right shapes (the score model's speed does not depend on them)."""
    from foldmill.model.boltz2 import TrunkOutput

    config, device = model.config, feats["token_pad_mask"].device
    batch, tokens = feats["token_pad_mask"].shape

    def random(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=generator, device=device)

    return TrunkOutput(
        s_inputs=random(batch, tokens, config.token_s),
        s=random(batch, tokens, config.token_s),
        z=random(batch, tokens, tokens, config.token_z),
        relative_position_encoding=random(batch, tokens, tokens, config.token_z),
    )


def measure_input(runners: dict[str, FastBoltz2], feats: dict, args: argparse.Namespace, name: str, out: Path) -> dict:
    """One input's row; runners: "fast" (default options), "module" (kernels off: the bf16 module, not
    restructured) and "fp32"."""
    fast, module, fp32 = runners["fast"], runners["module"], runners["fp32"]
    samples, device = args.samples, feats["token_pad_mask"].device
    generator = torch.Generator(device=device).manual_seed(args.seed)
    trunk = _trunk_like(fast.model, feats, generator)
    network = fast.network
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
        conditioning = network.diffusion_conditioning(trunk.s, trunk.z, trunk.relative_position_encoding, feats)
        per_record = fast.score_model.single_conditioner.embed_trunk(trunk.s, trunk.s_inputs)
        embedded = per_record.repeat_interleave(samples, 0)  # the module's input: one row per sample
    del trunk.z, trunk.relative_position_encoding
    atoms = feats["atom_pad_mask"].shape[1]
    noisy = 0.5 * torch.randn((samples, atoms, 3), generator=generator, device=device)
    times = torch.full((samples,), 0.3, device=device)
    score_graphs = GraphedCall(fast._run_fast_score, per_call=(True, True, False))
    with torch.no_grad():
        plan = fast.fast_score.prepare(conditioning, feats, per_record, samples)  # masks the token bias in place
        fast_out = fast._run_fast_score(noisy, times, plan).clone()
        reference_out = module._run_score_model(noisy, times, embedded, feats, conditioning, samples).clone()
        fp32_conditioning = type(conditioning)(**{k: v.float() for k, v in vars(conditioning).items()})
        with kernels.kernel_policy(enabled=False):
            fp32_out = fp32._run_score_model(noisy, times, embedded.float(), feats, fp32_conditioning, samples)
        del fp32_conditioning
        row: dict[str, Any] = {
            "input": name,
            "tokens": feats["token_pad_mask"].shape[1],
            "atoms": atoms,
            "samples": samples,
            "error_vs_reference_bf16": relative_error(fast_out, reference_out),
            "error_vs_fp32": relative_error(fast_out, fp32_out),
            "reference_error_vs_fp32": relative_error(reference_out, fp32_out),
            "reference_eager_ms": milliseconds(
                lambda: module._run_score_model(noisy, times, embedded, feats, conditioning, samples), args.repeats
            ),
            "reference_graph_ms": milliseconds(
                lambda: module.graphs(noisy, times, embedded, feats, conditioning, samples), args.repeats
            ),
            "fast_eager_ms": milliseconds(lambda: fast._run_fast_score(noisy, times, plan), args.repeats),
            "fast_graph_ms": milliseconds(lambda: score_graphs(noisy, times, plan), args.repeats),
        }
        row["graph_speedup"] = round(row["reference_graph_ms"] / row["fast_graph_ms"], 2)
        row.update(_sampling_step(fast, trunk, feats, conditioning, samples))
        if args.profile:
            _profile(lambda: fast._run_fast_score(noisy, times, plan), out / f"profile_{name}.txt")
    return row


def _sampling_step(fast: FastBoltz2, trunk: Any, feats: dict, conditioning: Any, samples: int) -> dict[str, Any]:
    """Milliseconds per whole sampling step (FastBoltz2.sample: graphed steps), and the host
    synchronisations in one sampling run."""

    def sample(steps: int) -> None:
        fast.sample(trunk, feats, conditioning, InferenceRecipe(0, steps, samples, samples, seed=0))

    sample(3)  # capture
    seconds = {steps: cuda_median_ms(lambda steps=steps: sample(steps), repeats=1, warmup=0) for steps in (5, 25)}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            sample(3)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = sorted({str(w.message).split("\n")[0][:120] for w in caught if "synchroniz" in str(w.message)})
    return {"step_ms": round((seconds[25] - seconds[5]) / 20, 3), "sampler_syncs": syncs}


def _profile(call: Callable[[], Any], path: Path) -> None:
    from torch.profiler import ProfilerActivity, profile

    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            call()
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=90)
    write_text_atomic(path, table + "\n")


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| input | tokens | samples | reference eager / graph ms | restructured eager / graph ms | speedup (graphs) "
        "| sampling step ms | error vs reference / vs fp32 (reference vs fp32) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['input']} | | | {r['error']} | | | | |")
            continue
        lines.append(
            f"| {r['input']} | {r['tokens']} | {r['samples']} | {r['reference_eager_ms']} / {r['reference_graph_ms']} "
            f"| {r['fast_eager_ms']} / {r['fast_graph_ms']} | {r['graph_speedup']}x | {r['step_ms']} "
            f"| {r['error_vs_reference_bf16']} / {r['error_vs_fp32']} ({r['reference_error_vs_fp32']}) |"
        )
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        raise FoldmillError("foldmill bench score needs a CUDA GPU")
    from foldmill.model.demo import randomize_weights

    device = torch.device("cuda")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with torch.device(device):
        model = Boltz2(Boltz2Config())
    randomize_weights(model, args.seed)
    model.eval()
    runners = {
        "fast": FastBoltz2(model, FastPathOptions()),
        "module": FastBoltz2(model, FastPathOptions(kernels=False)),
        "fp32": FastBoltz2(model, FastPathOptions(precision="fp32", kernels=False)),
    }
    features_dir = Path(args.features) if args.features else None
    rows = []
    for item in parse_inputs(args.inputs):
        feats, _ = pad_token_features(get_features(item, features_dir, device), runners["fast"].options.pad_tokens_to)
        try:
            rows.append(measure_input(runners, feats, args, item.name, out))
        except Exception as error:  # noqa: BLE001 - one failing input must not end the benchmark
            rows.append({"input": item.name, "error": f"{type(error).__name__}: {error}"})
        print(json.dumps(rows[-1]), flush=True)
        write_text_atomic(out / "score_bench.json", json.dumps(rows, indent=1) + "\n")
        write_text_atomic(out / "score_bench.md", markdown(rows))
        torch.cuda.empty_cache()
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    from foldmill.bench._standalone import main

    raise SystemExit(main(register))
