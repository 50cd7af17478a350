"""`foldmill bench moe-parity`: loss parity of the MoE expert backends on a real protein corpus.

One configuration file (config/moe/parity.yaml) fixes everything: the corpus sources, the model
(a named model with its depth and width reduced), the training recipe, the backends and the seeds.
For each seed, every backend trains the same model from the same initial weights on the same
batches in the same order; only the expert GEMMs differ. Each backend's final validation loss is
compared with the reference backend's of the same seed, and the mean of those differences over the
seeds is held against the tolerance; the reference's own spread across seeds is reported beside it
as the noise floor. The corpus is built first: FASTA records and the rows of A3M alignments (gaps
removed, insertions upper-cased), deduplicated by sequence, then packed by `foldmill pretrain
prepare-corpus`'s code with a validation split chosen by a hash of each sequence, so a sequence is
never in both splits.

Writes to --out: parity.json (per seed and backend: per-step training losses and validation
losses; per backend: the curves averaged over seeds, final validation losses and their relative
differences from the reference), parity.md (the table), parity.svg (the seed-averaged curves;
parity.png as well where matplotlib imports), sequences.fasta and corpus/.

    python -m foldmill.bench.moe_parity --config config/moe/parity.yaml   # without the full CLI
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import hashlib
import json
import math
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from foldmill.bench._out_dir import writes_only_its_own
from foldmill.errors import FoldmillError, InputError
from foldmill.io.atomic import write_text_atomic
from foldmill.moe.config import TrainConfig

DEFAULT_CONFIG = "config/moe/parity.yaml"
SECTIONS = {"corpus", "model", "train", "backends", "seeds", "reference", "eval_every", "tolerance"}
CORPUS_KEYS = {"sources", "val_fraction"}
# Settings the bench owns: one process, whole validation split, no checkpoints or log lines; the
# seed comes from `seeds`.
BENCH_OWNED = {"expert_backend", "eval_every", "eval_batches", "checkpoint_every", "log_every", "parallel",
               "expert_parallel", "seed"}
# Names the backends list takes besides the expert backends themselves: name -> (expert backend,
# TrainConfig overrides).
VARIANTS = {"fp8_rowwise_promoted_accumulation": ("fp8_rowwise", {"fp8_fast_accumulation": False}),
            "mxfp8_store_swiglu_input": ("mxfp8", {"mxfp8_store_swiglu_input": True})}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("moe-parity", help="loss parity of the MoE expert backends (bf16, FP8, MXFP8)")
    parser.add_argument("--config", default=DEFAULT_CONFIG, help="parity configuration (YAML)")
    parser.add_argument("--out", default="results/bench/moe_parity", help="directory for parity.json/.md/.svg")
    parser.add_argument("--steps", type=int, default=0, help="override the configured steps (0 = keep)")
    parser.add_argument("--backends", default="", help="override the configured backends (comma-separated)")
    parser.add_argument("--seeds", default="", help="override the configured seeds (comma-separated)")
    parser.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    parser.set_defaults(handler=writes_only_its_own(run))


# ---------------------------------------------------------------- configuration


def load_config(path: str | Path) -> dict:
    import yaml

    path = Path(path)
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise FoldmillError(f"{path}: cannot read the parity configuration ({error})") from None
    if not isinstance(config, dict):
        raise FoldmillError(f"{path}: the parity configuration must be a mapping")
    unknown = set(config) - SECTIONS
    if unknown:
        raise FoldmillError(
            f"{path}: unknown key(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(SECTIONS))}")
    for section in ("corpus", "model", "train", "backends"):
        if section not in config:
            raise FoldmillError(f"{path}: missing '{section}'")
    unknown = set(config["corpus"]) - CORPUS_KEYS
    if unknown:
        raise FoldmillError(f"{path}: unknown corpus key(s) {', '.join(sorted(unknown))}")
    train_fields = {f.name for f in dataclasses.fields(TrainConfig)} - BENCH_OWNED
    unknown = set(config["train"]) - train_fields
    if unknown:
        hint = " (seeds go in the top-level 'seeds' list)" if "seed" in unknown else ""
        raise FoldmillError(f"{path}: train key(s) {', '.join(sorted(unknown))} are not training settings "
                            f"the parity run takes{hint}")
    config.setdefault("seeds", [0])
    check_seeds(config["seeds"], f"{path}: 'seeds'")
    config.setdefault("reference", "grouped")
    config.setdefault("eval_every", 100)
    config.setdefault("tolerance", 0.01)
    check_backends(config["backends"], f"{path}: backends")
    if config["reference"] not in config["backends"]:
        raise FoldmillError(f"{path}: reference backend {config['reference']!r} is not among the backends")
    return config


def check_backends(backends: list, what: str) -> None:
    from foldmill.moe.experts import BACKENDS

    unknown = [b for b in backends if b not in BACKENDS and b not in VARIANTS]
    if unknown:
        raise FoldmillError(f"{what}: unknown backend(s) {', '.join(map(str, unknown))}; "
                            f"known: {', '.join([*BACKENDS, *VARIANTS])}")


def check_seeds(seeds: object, what: str) -> None:
    if (not isinstance(seeds, list) or not seeds or len(set(seeds)) != len(seeds)
            or not all(isinstance(seed, int) and not isinstance(seed, bool) for seed in seeds)):
        raise FoldmillError(f"{what} must be a list of distinct integers, got {seeds!r}")


def parse_seeds(text: str) -> list[int]:
    """--seeds "0,1,2" -> [0, 1, 2]; a one-line error for anything else."""
    try:
        seeds = [int(seed) for seed in text.split(",")]
    except ValueError:
        raise FoldmillError(f"--seeds {text!r}: expected comma-separated integers, e.g. 0,1,2") from None
    check_seeds(seeds, "--seeds")
    return seeds


# ---------------------------------------------------------------- corpus


def iter_a3m(path: Path) -> Iterator[tuple[str, str]]:
    """(record id, sequence) per row of an A3M alignment: gaps removed, insertions upper-cased."""
    record: str | None = None
    chunks: list[str] = []
    try:
        with open(path, encoding="utf-8") as handle:
            for number, raw in enumerate(handle, start=1):
                line = raw.strip()
                if not line or line[0] in "#;":
                    continue
                if line.startswith(">"):
                    if record is not None:
                        yield record, "".join(chunks)
                    record, chunks = (line[1:].split() or [f"line{number}"])[0], []
                elif record is None:
                    raise InputError(str(path), f"line {number}", "alignment row before the first '>' header")
                else:
                    chunks.append(line.replace("-", "").replace(".", "").upper())
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(str(path), None, f"cannot read A3M: {error}") from None
    if record is not None:
        yield record, "".join(chunks)


def gather_sequences(sources: list[str]) -> tuple[list[tuple[str, str, str]], dict[str, dict[str, int]]]:
    """Unique sequences [(id, origin, sequence)] in source order, and per source: records, new sequences.

    The id is a hash of the sequence, so the validation split (a hash of the id) is a split by sequence.
    """
    from foldmill.moe.data.fasta import iter_fasta

    seen: set[str] = set()
    unique: list[tuple[str, str, str]] = []
    counts: dict[str, dict[str, int]] = {}
    for source in sources:
        path = Path(source)
        if not path.is_file():
            raise InputError(str(path), None, "corpus source not found")
        reader = iter_a3m(path) if path.suffix == ".a3m" else iter_fasta(path)
        records = added = 0
        for record, sequence in reader:
            records += 1
            sequence = sequence.upper().rstrip("*")
            if not sequence or sequence in seen:
                continue
            seen.add(sequence)
            added += 1
            digest = hashlib.sha1(sequence.encode("ascii", errors="replace")).hexdigest()[:16]
            unique.append((f"s{digest}", f"{path.name}:{record}", sequence))
        counts[str(source)] = {"records": records, "unique_sequences_added": added}
    return unique, counts


def build_corpus(config: dict, out: Path) -> dict:
    """Under out: sequences.fasta (the unique sequences) and corpus/, the packed, split corpus."""
    from foldmill.moe.data.corpus import prepare_corpus

    sources = [str(s) for s in config["corpus"]["sources"]]
    unique, counts = gather_sequences(sources)
    corpus_dir = out / "corpus"
    out.mkdir(parents=True, exist_ok=True)
    fasta = "".join(f">{identifier} {origin}\n{sequence}\n" for identifier, origin, sequence in unique)
    write_text_atomic(out / "sequences.fasta", fasta)
    meta = prepare_corpus([out / "sequences.fasta"], corpus_dir,
                          val_fraction=float(config["corpus"].get("val_fraction", 0.1)))
    return {"dir": str(corpus_dir), "sources": counts, "unique_sequences": len(unique),
            "residues": sum(len(s) for _, _, s in unique), "splits": meta["splits"],
            "rejected_records": meta["rejected_records"]}


# ---------------------------------------------------------------- training


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_backend(name: str, corpus_dir: Path, run_dir: Path, train: dict, model: dict, eval_every: int,
                  device: torch.device) -> dict:
    """Train one backend (or variant); per-step training cross-entropy, validation every eval_every steps and
    at the end."""
    from foldmill.moe.train.distributed import Dist
    from foldmill.moe.train.trainer import Trainer

    backend, overrides = VARIANTS.get(name, (name, {}))
    config = TrainConfig(**{**train, **overrides}, expert_backend=backend, eval_batches=0, log_every=10**9)
    trainer = Trainer(corpus_dir, run_dir, config, Dist(0, 1, device), model_overrides=model)
    validation = [{"step": 0, **trainer.validate()}]
    losses: list[torch.Tensor] = []
    segment_ms: list[float] = []
    started = time.perf_counter()
    _synchronize(device)
    segment_start, segment_steps = time.perf_counter(), 0
    while trainer.step < config.steps:
        cross_entropy, _, _ = trainer.train_step()
        losses.append(cross_entropy)
        segment_steps += 1
        if trainer.step % eval_every == 0 or trainer.step == config.steps:
            _synchronize(device)
            segment_ms.append((time.perf_counter() - segment_start) * 1e3 / segment_steps)
            validation.append({"step": trainer.step, **trainer.validate()})
            _synchronize(device)
            segment_start, segment_steps = time.perf_counter(), 0
    train_loss = [round(float(v), 5) for v in torch.stack(losses).float().cpu()]
    tail = train_loss[-max(len(train_loss) // 20, 1):]
    curve = [{"step": v["step"], "val_loss": round(v["val_loss"], 5)} for v in validation]
    result = {
        "train_loss": train_loss,
        "validation": curve,
        "final_val_loss": validation[-1]["val_loss"],
        # Lowest validation loss and its step: below the final one when the run has begun to overfit.
        "best_val": min(curve, key=lambda v: v["val_loss"]),
        "val_tokens": validation[-1]["val_tokens"],
        "final_train_loss": sum(tail) / len(tail),
        "train_loss_tail_steps": len(tail),
        # Median over the stretches between validations: the first holds compilation and warm-up.
        "ms_per_step": round(statistics.median_high(segment_ms), 2),
        "wall_s": round(time.perf_counter() - started, 1),
        "model_config": dataclasses.asdict(trainer.model_config),
        "train_config": dataclasses.asdict(config),
    }
    if device.type == "cuda":
        result["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    del trainer
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    return result


def average_over_seeds(by_seed: dict[int, dict]) -> dict:
    """One backend's runs folded into one: curves and losses averaged over its seeds."""
    runs = list(by_seed.values())
    first = runs[0]
    train_loss = [round(statistics.fmean(values), 5) for values in zip(*(r["train_loss"] for r in runs), strict=True)]
    validation = [{"step": points[0]["step"], "val_loss": round(statistics.fmean(p["val_loss"] for p in points), 5)}
                  for points in zip(*(r["validation"] for r in runs), strict=True)]
    finals = {seed: r["final_val_loss"] for seed, r in by_seed.items()}
    return {
        "seeds": list(by_seed),
        "final_val_loss": statistics.fmean(finals.values()),
        "final_val_loss_per_seed": finals,
        "train_loss": train_loss,
        "validation": validation,
        "best_val": min(validation, key=lambda v: v["val_loss"]),
        "val_tokens": first["val_tokens"],
        "final_train_loss": statistics.fmean(r["final_train_loss"] for r in runs),
        "ms_per_step": statistics.median_high(r["ms_per_step"] for r in runs),
        "wall_s": round(sum(r["wall_s"] for r in runs), 1),
        "model_config": first["model_config"],
        "train_config": {k: v for k, v in first["train_config"].items() if k != "seed"},
    }


def compare(runs: dict[str, dict[int, dict]], reference: str, tolerance: float) -> dict[str, dict]:
    """Each backend's final validation loss relative to the reference's of the same seed, and the mean of
    those differences over the seeds both finished, held against the tolerance."""
    base, out = runs[reference], {}
    for name, by_seed in runs.items():
        per_seed = {seed: (result["final_val_loss"] - base[seed]["final_val_loss"]) / base[seed]["final_val_loss"]
                    for seed, result in by_seed.items() if seed in base}
        difference = statistics.fmean(per_seed.values())
        out[name] = {"rel_diff_vs_reference": difference, "rel_diff_per_seed": per_seed,
                     "within_tolerance": abs(difference) <= tolerance}
    return out


def seed_spread(by_seed: dict[int, dict]) -> float | None:
    """(max - min) / mean of one backend's final validation losses over its seeds; None with one seed."""
    finals = [r["final_val_loss"] for r in by_seed.values()]
    return (max(finals) - min(finals)) / statistics.fmean(finals) if len(finals) > 1 else None


# ---------------------------------------------------------------- report

LABELS = {"loop": "bf16 loop", "grouped": "bf16 grouped", "fp8_rowwise": "FP8 row-wise", "mxfp8": "MXFP8",
          "fp8_rowwise_promoted_accumulation": "FP8 row-wise, promoted accumulation",
          "mxfp8_store_swiglu_input": "MXFP8, SwiGLU input stored in MXFP8"}
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e")


def markdown_table(payload: dict) -> str:
    reference, tolerance = payload["reference"], payload["tolerance"]
    lines = [f"| backend | final val loss | vs {LABELS.get(reference, reference)} | within {tolerance:.0%} | "
             "per seed: final val loss (vs reference) | lowest val loss (step) | final train loss | ms/step | run s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, result in payload["backends"].items():
        comparison = payload["comparison"][name]
        per_seed = "; ".join(f"{seed}: {loss:.4f} ({comparison['rel_diff_per_seed'][seed]:+.2%})"
                             for seed, loss in result["final_val_loss_per_seed"].items()
                             if seed in comparison["rel_diff_per_seed"])
        lines.append(
            f"| {LABELS.get(name, name)} | {result['final_val_loss']:.4f} | "
            f"{comparison['rel_diff_vs_reference']:+.3%} | "
            f"{'yes' if comparison['within_tolerance'] else 'no'} | {per_seed} | "
            f"{result['best_val']['val_loss']:.4f} ({result['best_val']['step']}) | {result['final_train_loss']:.4f} | "
            f"{result['ms_per_step']} | {result['wall_s']} |")
    return "\n".join(lines) + "\n"


def smoothed(values: list[float], window: int) -> list[float]:
    """Trailing mean over `window` steps (shorter at the start)."""
    out, total = [], 0.0
    for index, value in enumerate(values):
        total += value
        if index >= window:
            total -= values[index - window]
        out.append(total / min(index + 1, window))
    return out


Series = list[tuple[str, list[tuple[float, float]]]]  # (backend, [(step, loss)])


def _series(payload: dict) -> tuple[Series, Series]:
    steps = max(len(r["train_loss"]) for r in payload["backends"].values())
    window = max(steps // 100, 1)
    train, val = [], []
    for name, result in payload["backends"].items():
        curve = smoothed(result["train_loss"], window)
        stride = max(len(curve) // 400, 1)
        train.append((name, [(i + 1, v) for i, v in enumerate(curve) if i % stride == 0 or i == len(curve) - 1]))
        val.append((name, [(v["step"], v["val_loss"]) for v in result["validation"]]))
    return train, val


def svg_plot(payload: dict) -> str:
    """Two panels (training loss, smoothed; validation loss) as a self-contained SVG."""
    train, val = _series(payload)
    width, height, margin = 460, 320, (58, 20, 30, 46)  # left, right, top, bottom
    panels = []
    for offset, (title, series) in enumerate((("training loss (trailing mean)", train), ("validation loss", val))):
        points = [p for _, curve in series for p in curve if math.isfinite(p[1])]
        x_max = max(p[0] for p in points) or 1
        # Skip the first tenth of the training curve when scaling y: the start dwarfs the rest.
        body = [p for p in points if p[0] >= 0.1 * x_max] or points
        y_min, y_max = min(p[1] for p in body), max(p[1] for p in body)
        pad = (y_max - y_min) * 0.05 or 0.05
        y_min, y_max = y_min - pad, y_max + pad
        left, right, top, bottom = margin
        plot_w, plot_h = width - left - right, height - top - bottom

        def x_of(x: float) -> float:
            return left + plot_w * x / x_max

        def y_of(y: float) -> float:
            return top + plot_h * (1 - (min(max(y, y_min), y_max) - y_min) / (y_max - y_min))

        parts = [f'<g transform="translate({offset * width},0)">',
                 f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#444"/>',
                 f'<text x="{left + plot_w / 2}" y="{top - 10}" text-anchor="middle">{title}</text>',
                 f'<text x="{left + plot_w / 2}" y="{height - 8}" text-anchor="middle">step</text>']
        for tick in range(5):
            y = y_min + (y_max - y_min) * tick / 4
            x = x_max * tick / 4
            parts.append(f'<text x="{left - 6}" y="{y_of(y) + 4:.1f}" text-anchor="end">{y:.3f}</text>')
            parts.append(f'<text x="{x_of(x):.1f}" y="{top + plot_h + 16}" text-anchor="middle">{x:.0f}</text>')
        for index, (name, curve) in enumerate(series):
            coordinates = " ".join(f"{x_of(x):.1f},{y_of(y):.1f}" for x, y in curve if math.isfinite(y))
            parts.append(f'<polyline data-backend="{name}" fill="none" stroke="{COLORS[index % len(COLORS)]}" '
                         f'stroke-width="1.5" points="{coordinates}"/>')
            parts.append(f'<text x="{left + plot_w - 8}" y="{top + 16 + 15 * index}" text-anchor="end" '
                         f'fill="{COLORS[index % len(COLORS)]}">{LABELS.get(name, name)}</text>')
        parts.append("</g>")
        panels.append("\n".join(parts))
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * width}" height="{height}" '
            f'font-family="sans-serif" font-size="11">\n<rect width="100%" height="100%" fill="white"/>\n'
            + "\n".join(panels) + "\n</svg>\n")


def png_plot(payload: dict, path: Path) -> bool:
    """The same two panels with matplotlib, where it imports; False otherwise."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    train, val = _series(payload)
    figure, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for axis, title, series in ((axes[0], "training loss (trailing mean)", train), (axes[1], "validation loss", val)):
        for index, (name, curve) in enumerate(series):
            axis.plot([p[0] for p in curve], [p[1] for p in curve], color=COLORS[index % len(COLORS)],
                      label=LABELS.get(name, name), linewidth=1.2)
        steps = max(p[0] for _, curve in series for p in curve)
        body = [p[1] for _, curve in series for p in curve if p[0] >= 0.1 * steps]
        if body:
            pad = (max(body) - min(body)) * 0.05 or 0.05
            axis.set_ylim(min(body) - pad, max(body) + pad)
        axis.set_title(title)
        axis.set_xlabel("step")
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return True


# ---------------------------------------------------------------- entry


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    elif args.device == "cuda" and not torch.cuda.is_available():
        raise FoldmillError("--device cuda: no CUDA GPU here")
    else:
        device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(device.index or 0)
        device = torch.device("cuda", torch.cuda.current_device())
    backends = [b for b in (args.backends.split(",") if args.backends else config["backends"]) if b]
    check_backends(backends, "--backends")
    reference = config["reference"] if config["reference"] in backends else backends[0]
    seeds = parse_seeds(args.seeds) if args.seeds else config["seeds"]
    train = dict(config["train"])
    if args.steps:
        train["steps"] = args.steps
    eval_every = int(config["eval_every"]) or int(train.get("steps", 1))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    corpus = build_corpus(config, out)
    print(json.dumps({"corpus": corpus}), flush=True)
    payload = {
        "config": str(args.config), "config_values": config, "device": torch.cuda.get_device_name(device)
        if device.type == "cuda" else "cpu", "torch": torch.__version__, "corpus": corpus,
        "reference": reference, "tolerance": float(config["tolerance"]), "seeds": seeds,
        "backends": {}, "comparison": {}, "reference_seed_spread": None, "runs": {},
    }
    runs: dict[str, dict[int, dict]] = {}
    # Seed by seed, the reference first; parity.json is rewritten after every run, so a run cut short
    # keeps what it finished.
    for seed in seeds:
        for backend in [reference, *(b for b in backends if b != reference)]:
            result = train_backend(backend, Path(corpus["dir"]), out / "runs" / backend / f"seed{seed}",
                                   {**train, "seed": seed}, dict(config["model"]), eval_every, device)
            runs.setdefault(backend, {})[seed] = result
            print(json.dumps({"backend": backend, "seed": seed, **{k: v for k, v in result.items() if k not in
                                                                   ("train_loss", "model_config", "train_config")}}),
                  flush=True)
            payload["runs"] = {name: {str(s): r for s, r in by_seed.items()} for name, by_seed in runs.items()}
            payload["backends"] = {name: average_over_seeds(by_seed) for name, by_seed in runs.items()}
            payload["comparison"] = compare(runs, reference, payload["tolerance"])
            payload["reference_seed_spread"] = seed_spread(runs[reference])
            payload["wall_s"] = round(time.perf_counter() - started, 1)
            write_text_atomic(out / "parity.json", json.dumps(payload, indent=1) + "\n")
    first = payload["backends"][reference]
    tokens = first["train_config"]["batch_size"] * first["train_config"]["seq_len"] * len(first["train_loss"])
    payload["train_epochs"] = round(tokens / max(corpus["splits"]["train"]["tokens"], 1), 2)
    write_text_atomic(out / "parity.json", json.dumps(payload, indent=1) + "\n")
    table = markdown_table(payload)
    model = first["model_config"]
    spread = payload["reference_seed_spread"]
    header = (f"{payload['device']}, torch {torch.__version__}. Model: {model['num_layers']} layers, hidden "
              f"{model['hidden_size']}, {model['num_heads']}/{model['num_kv_heads']} heads, {model['num_experts']} "
              f"experts x FFN {model['ffn_size']}, top-{model['top_k']}; {len(first['train_loss'])} steps of "
              f"{first['train_config']['batch_size']} x {first['train_config']['seq_len']} tokens "
              f"({payload['train_epochs']} epochs of the training split), {first['train_config']['precision']}. "
              f"Corpus: {corpus['unique_sequences']} unique sequences, {corpus['splits']['train']['records']} train / "
              f"{corpus['splits']['val']['records']} validation; validation over {first['val_tokens']} tokens. "
              f"Seeds: {', '.join(map(str, seeds))} (losses and curves are means over them"
              + (f"; {LABELS.get(reference, reference)}'s final validation loss spreads {spread:.2%} across them, "
                 "max - min over mean" if spread is not None else "") + ").\n\n")
    write_text_atomic(out / "parity.md", header + table)
    write_text_atomic(out / "parity.svg", svg_plot(payload))
    png_plot(payload, out / "parity.png")
    print(header + table, flush=True)
    return 0


if __name__ == "__main__":
    from foldmill.bench._standalone import main

    raise SystemExit(main(register))
