"""Session 9, device only: where a replica's first target goes with a warm Triton cache.

Builds the full-size demo model and the fast-path runner as a replica does (timing the runner's
build, which imports the kernel backends since kernels.load_backends), then runs `predict`
(3 recycles, 200 steps, 5 samples) on the same 1,000-token input twice under cProfile, and writes
each call's stage seconds and its 40 heaviest functions (cumulative and own time).

    python3 first_target_profile.py OUT_DIR FEATURES_DIR
"""

import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path

import torch

from foldmill.bench._inputs import load_features
from foldmill.model.boltz2 import Boltz2
from foldmill.model.config import Boltz2Config, InferenceRecipe
from foldmill.model.demo import randomize_weights
from foldmill.model.fastpath import TRAINING_ONLY_FEATURES, FastBoltz2

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
model = Boltz2(Boltz2Config())
randomize_weights(model, 0)
torch.cuda.synchronize()
begin = time.perf_counter()
fast = FastBoltz2(model.eval(), device=torch.device("cuda"))
torch.cuda.synchronize()
report = [{"runner_build_s": round(time.perf_counter() - begin, 2)}]
print(json.dumps(report[0]), flush=True)
recipe = InferenceRecipe(recycling_steps=3, sampling_steps=200, diffusion_samples=5, max_parallel_samples=5, seed=0)
features = load_features(Path(sys.argv[2]) / "features_1000.npz", "cuda")
features = {key: value for key, value in features.items() if key not in TRAINING_ONLY_FEATURES}
for call in ("first", "second"):
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    begin = time.perf_counter()
    profiler.enable()
    fast.predict(features, recipe)
    torch.cuda.synchronize()
    profiler.disable()
    row = {"call": call, "wall_s": round(time.perf_counter() - begin, 2), **{k: round(v, 2) for k, v in fast.stage_seconds.items()}}
    report.append(row)
    print(json.dumps(row), flush=True)
    for order in ("cumulative", "tottime"):
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(40)
        (out / f"{call}_{order}.txt").write_text(text.getvalue())
(out / "first_target_profile.json").write_text(json.dumps(report, indent=1))
