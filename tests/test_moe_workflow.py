"""The MoE rules run for real under Snakemake on the demo config (CPU, a few steps)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_demo_prepare_pretrain_evaluate(repo, tmp_path):
    outdir = tmp_path / "results"
    target = outdir / "moe/evaluation.json"
    # Optimizer settings a user's config adds on top of the demo's reach the training run.
    optimizer = tmp_path / "optimizer.yaml"
    optimizer.write_text("moe:\n  grad_clip: 0.5\n  beta2: 0.99\n  weight_decay: 0.0\n  eval_every: 4\n")
    command = [sys.executable, "-m", "snakemake", "--cores", "2", "--configfile", "config/demo/config.yaml",
               str(optimizer), "--config", f"outdir={outdir}", "--", str(target)]  # fmt: skip
    completed = subprocess.run(command, cwd=repo, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    evaluation = json.loads(target.read_text())
    summary = json.loads((outdir / "moe/run/summary.json").read_text())
    assert evaluation["step"] == summary["steps"] == 8
    assert evaluation["checkpoint"] == summary["checkpoint"]
    assert 1.0 < evaluation["val_perplexity"] < 29.0  # better than uniform over the 29 tokens
    metrics = (outdir / "moe/run/metrics.jsonl").read_text().splitlines()
    assert len([line for line in metrics if '"loss"' in line]) == 4
    assert [json.loads(line)["step"] for line in metrics if '"val_loss"' in line] == [4, 8]
    trained = summary["train_config"]
    assert (trained["grad_clip"], trained["beta2"], trained["weight_decay"], trained["eval_every"]) == (0.5, 0.99, 0.0, 4)
    assert (trained["steps"], trained["lr"], trained["beta1"]) == (8, 0.003, 0.9)  # the demo's and the schema's
    for rule in ("moe_prepare_corpus", "moe_pretrain", "moe_evaluate"):
        assert (outdir / "logs" / f"{rule}.log").is_file()
    # rerunning finds nothing to do
    again = subprocess.run(command, cwd=repo, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr


def test_a_config_without_inputs_runs_pretraining_alone(repo, tmp_path):
    """A user's own config with a corpus and no inputs: `rule all` builds the MoE outputs and
    nothing of folding, with no Boltz-2 checkpoint given."""
    outdir = tmp_path / "results"
    config = tmp_path / "pretrain.yaml"
    config.write_text(f"outdir: {outdir}\nmoe:\n  enabled: true\n  corpus: [config/demo/yeast_chr1.fasta]\n"
                      "  model: tiny\n  steps: 2\n  batch_size: 2\n  seq_len: 64\n  precision: fp32\n  gpus: 0\n"
                      "  eval_batches: 2\n")
    command = [sys.executable, "-m", "snakemake", "--cores", "2", "--configfile", str(config)]
    completed = subprocess.run(command, cwd=repo, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    evaluation = json.loads((outdir / "moe/evaluation.json").read_text())
    assert evaluation["step"] == 2 and evaluation["model"] == "tiny"
    assert sorted(path.name for path in outdir.iterdir()) == ["logs", "moe"]
