"""`foldmill bench moe-parity` on CPU: a few steps of a tiny model per backend (8-bit GEMMs emulated)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.dom.minidom
from pathlib import Path

import pytest
import yaml

from foldmill.bench.moe_parity import check_backends, gather_sequences, iter_a3m, load_config, parse_seeds
from foldmill.errors import FoldmillError, InputError

REPO = Path(__file__).resolve().parents[1]
MSA = REPO / "tests/data/msas/seq2.a3m"
BACKENDS = ["grouped", "fp8_rowwise", "fp8_rowwise_promoted_accumulation", "mxfp8", "mxfp8_store_swiglu_input"]
SEEDS = [3, 4]
STEPS, EVAL_EVERY = 4, 2

# Runs the module as `python -m` would and fails if it pulled in Ray.
STANDALONE = (
    "import runpy, sys\n"
    "try:\n"
    "    runpy.run_module('foldmill.bench.moe_parity', run_name='__main__')\n"
    "except SystemExit as stop:\n"
    "    code = stop.code\n"
    "assert 'ray' not in sys.modules, 'the parity bench imported ray'\n"
    "sys.exit(code)\n"
)


@pytest.fixture(scope="module")
def parity_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("parity")
    config = {
        "corpus": {"sources": [str(MSA)], "val_fraction": 0.1},
        "model": {"hidden_size": 64, "ffn_size": 64, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1},
        "train": {"model": "bio_8x1b", "steps": 50, "batch_size": 2, "seq_len": 64, "lr": 0.003, "warmup_steps": 1,
                  "precision": "bf16-mixed"},
        "backends": BACKENDS, "seeds": SEEDS, "reference": "grouped", "eval_every": EVAL_EVERY, "tolerance": 0.01,
    }
    (root / "parity.yaml").write_text(yaml.safe_dump(config))
    out = root / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run(
        [sys.executable, "-c", STANDALONE, "--config", str(root / "parity.yaml"), "--out", str(out),
         "--steps", str(STEPS), "--device", "cpu"],
        cwd=root, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return out, json.loads((out / "parity.json").read_text())


def test_every_backend_trains_the_same_steps_and_validates_on_schedule(parity_run: tuple[Path, dict]) -> None:
    _, payload = parity_run
    assert list(payload["runs"]) == BACKENDS and payload["seeds"] == SEEDS
    for name, by_seed in payload["runs"].items():
        assert list(by_seed) == [str(seed) for seed in SEEDS], name
        for seed, result in by_seed.items():
            assert len(result["train_loss"]) == STEPS, name  # --steps overrides the configured 50
            assert [v["step"] for v in result["validation"]] == [0, 2, 4], name
            assert result["final_val_loss"] == pytest.approx(result["validation"][-1]["val_loss"], abs=1e-5)
            assert result["best_val"]["val_loss"] == min(v["val_loss"] for v in result["validation"])
            assert result["train_config"]["seed"] == int(seed)
            assert result["model_config"]["expert_backend"] == name.split("_promoted")[0].split("_store")[0]
            # Fast accumulation by default; the variant promotes; the other backends never read it.
            assert result["model_config"]["fp8_fast_accumulation"] == (name == "fp8_rowwise"), name
            assert result["model_config"]["mxfp8_store_swiglu_input"] == (name == "mxfp8_store_swiglu_input"), name
            assert result["model_config"]["hidden_size"] == 64 and result["model_config"]["num_experts"] == 8
            # The whole validation split every time: the same token count for every backend.
            assert result["val_tokens"] == payload["runs"]["grouped"][seed]["val_tokens"] > 0
            assert result["train_loss"][-1] < result["train_loss"][0], name


def test_backends_start_from_the_same_weights_and_batches_per_seed(parity_run: tuple[Path, dict]) -> None:
    _, payload = parity_run
    runs = payload["runs"]
    for seed in map(str, SEEDS):
        reference = runs["grouped"][seed]
        for name in BACKENDS[1:]:
            result = runs[name][seed]
            # Same initial weights and data: before training only the 8-bit rounding differs.
            assert result["validation"][0]["val_loss"] == pytest.approx(reference["validation"][0]["val_loss"],
                                                                        rel=2e-3)
            assert result["train_loss"][0] == pytest.approx(reference["train_loss"][0], rel=2e-3)
    # Another seed: other initial weights and batches.
    assert runs["grouped"]["3"]["train_loss"][0] != runs["grouped"]["4"]["train_loss"][0]


def test_seed_means_comparison_and_table_follow_from_the_runs(parity_run: tuple[Path, dict]) -> None:
    out, payload = parity_run
    runs, table = payload["runs"], (out / "parity.md").read_text()
    base = {seed: runs["grouped"][seed]["final_val_loss"] for seed in runs["grouped"]}
    for name, by_seed in runs.items():
        result, comparison = payload["backends"][name], payload["comparison"][name]
        finals = {seed: r["final_val_loss"] for seed, r in by_seed.items()}
        assert result["final_val_loss"] == pytest.approx(sum(finals.values()) / len(finals))
        first_steps = [r["train_loss"][0] for r in by_seed.values()]
        assert result["train_loss"][0] == pytest.approx(sum(first_steps) / len(first_steps), abs=1e-5)
        differences = {seed: (finals[seed] - base[seed]) / base[seed] for seed in finals}
        assert comparison["rel_diff_per_seed"] == pytest.approx(differences)
        difference = sum(differences.values()) / len(differences)
        assert comparison["rel_diff_vs_reference"] == pytest.approx(difference)
        assert comparison["within_tolerance"] == (abs(difference) <= payload["tolerance"])
        assert f"{result['final_val_loss']:.4f} | {difference:+.3%}" in table
    assert payload["comparison"]["grouped"]["rel_diff_vs_reference"] == 0.0
    spread = (max(base.values()) - min(base.values())) / (sum(base.values()) / len(base))
    assert payload["reference_seed_spread"] == pytest.approx(spread) and spread > 0
    assert f"spreads {spread:.2%} across them" in table


def test_plot_draws_one_curve_per_backend_and_panel(parity_run: tuple[Path, dict]) -> None:
    out, _ = parity_run
    lines = xml.dom.minidom.parse(str(out / "parity.svg")).getElementsByTagName("polyline")
    assert sorted(line.getAttribute("data-backend") for line in lines) == sorted(BACKENDS * 2)
    validation_points = [line.getAttribute("points").split() for line in lines][len(BACKENDS):]
    assert all(len(points) == 3 for points in validation_points)


def test_corpus_is_deduplicated_degapped_and_split_by_sequence(parity_run: tuple[Path, dict]) -> None:
    out, payload = parity_run
    fasta = (out / "sequences.fasta").read_text().split("\n")
    sequences = fasta[1::2]
    assert sequences and len(set(sequences)) == len(sequences) == payload["corpus"]["unique_sequences"]
    assert all(s.isalpha() and s.isupper() for s in sequences)
    splits = payload["corpus"]["splits"]
    assert splits["train"]["records"] + splits["val"]["records"] == len(sequences)
    assert splits["val"]["records"] > 0


def test_a3m_rows_lose_gaps_and_keep_insertions(tmp_path: Path) -> None:
    a3m = tmp_path / "x.a3m"
    a3m.write_text("#12\t1\n; comment\n>query\nMKV-L\n>hit/2-5 desc\n-KaV-.L\n>dup\nMKVL\n")
    assert list(iter_a3m(a3m)) == [("query", "MKVL"), ("hit/2-5", "KAVL"), ("dup", "MKVL")]
    unique, counts = gather_sequences([str(a3m)])
    assert [s for _, _, s in unique] == ["MKVL", "KAVL"]
    assert counts[str(a3m)] == {"records": 3, "unique_sequences_added": 2}
    with pytest.raises(InputError, match="not found"):
        gather_sequences([str(tmp_path / "missing.fasta")])


def test_config_errors_name_the_problem(tmp_path: Path) -> None:
    config = load_config(REPO / "config/moe/parity.yaml")
    assert config["train"]["steps"] == 2000 and config["backends"] == BACKENDS
    assert all((REPO / source).is_file() for source in config["corpus"]["sources"])
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**config, "train": {**config["train"], "expert_backend": "grouped"}}))
    with pytest.raises(FoldmillError, match="expert_backend"):
        load_config(bad)
    bad.write_text(yaml.safe_dump({**config, "backends": ["grouped", "fp9"]}))
    with pytest.raises(FoldmillError, match="unknown backend.*fp9"):
        load_config(bad)
    with pytest.raises(FoldmillError, match="--backends: unknown backend.*fp9"):
        check_backends(["grouped", "fp9"], "--backends")
    bad.write_text(yaml.safe_dump({**config, "reference": "loop"}))
    with pytest.raises(FoldmillError, match="reference backend"):
        load_config(bad)
    bad.write_text(yaml.safe_dump({**config, "train": {**config["train"], "seed": 1}}))
    with pytest.raises(FoldmillError, match="'seeds' list"):
        load_config(bad)
    assert parse_seeds("4,0") == [4, 0]
    for text in ("a", "0,,1", "1,1"):
        with pytest.raises(FoldmillError, match="--seeds"):
            parse_seeds(text)
    for seeds in ([], [1, 1], "0", [0.5], [True]):
        bad.write_text(yaml.safe_dump({**config, "seeds": seeds}))
        with pytest.raises(FoldmillError, match="distinct integers"):
            load_config(bad)
