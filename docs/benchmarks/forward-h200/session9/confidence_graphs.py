"""Session 9, device only: the confidence pairformer's CUDA graphs, on and off.

The full-size demo model; two fast-path runners that differ only in max_confidence_graph_tokens
(512, the default, against 0: eager). Each predicts the same input twice (3 recycles, 200 steps, 5
samples): the first call of a shape captures, the second (a later target of that size) replays.
Reports the confidence stage's seconds and the peak memory per call.

    python3 confidence_graphs.py OUT_DIR FEATURES...
"""

import json
import sys
from pathlib import Path

import torch

from foldmill.bench._inputs import load_features
from foldmill.model.boltz2 import Boltz2
from foldmill.model.config import Boltz2Config, InferenceRecipe
from foldmill.model.demo import randomize_weights
from foldmill.model.fastpath import TRAINING_ONLY_FEATURES, FastBoltz2, FastPathOptions

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
model = Boltz2(Boltz2Config())
randomize_weights(model, 0)
model.eval()
runners = {
    "graphs": FastBoltz2(model, FastPathOptions(), device=torch.device("cuda")),
    "eager": FastBoltz2(model, FastPathOptions(max_confidence_graph_tokens=0), device=torch.device("cuda")),
}
recipe = InferenceRecipe(recycling_steps=3, sampling_steps=200, diffusion_samples=5, max_parallel_samples=5, seed=0)
report = []
for path in sys.argv[2:]:
    features = load_features(Path(path), "cuda")
    features = {key: value for key, value in features.items() if key not in TRAINING_ONLY_FEATURES}
    tokens = int(features["token_pad_mask"].shape[-1])
    outputs = {}
    for name, runner in runners.items():
        for call in ("first", "second"):
            torch.cuda.reset_peak_memory_stats()
            result = runner.predict(dict(features), recipe)
            row = {"tokens": tokens, "runner": name, "call": call, "confidence_s": round(runner.stage_seconds["confidence"], 3),
                   "trunk_s": round(runner.stage_seconds["trunk"], 3), "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)}  # fmt: skip
            print(json.dumps(row), flush=True)
            report.append(row)
            outputs[name] = result
    diff = float((outputs["graphs"]["plddt"] - outputs["eager"]["plddt"]).abs().max())
    report.append({"tokens": tokens, "plddt_max_diff_graphs_vs_eager": diff})
    print(json.dumps(report[-1]), flush=True)
(out / "confidence_graphs.json").write_text(json.dumps(report, indent=1))
