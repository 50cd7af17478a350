"""Session 8, device only: where a replica's start-up and its first target's one-time costs go.
Times the imports, the full-size Boltz2's construction, its random weights, the fast-path runner's
build, then `predict` (3 recycles, 200 steps, 5 samples) on the same input twice and a new size once,
with the runner's stage seconds each time.

    python3 startup_and_first_target.py OUT_DIR FEATURES_DIR
"""

import json
import sys
import time
from pathlib import Path

start = time.perf_counter()
report: dict = {}


def mark(name: str) -> None:
    global start
    report[name] = round(time.perf_counter() - start, 2)
    print(name, report[name], flush=True)
    start = time.perf_counter()


import torch  # noqa: E402

torch.cuda.init()
torch.empty(1, device="cuda")
mark("import_torch_and_cuda_init_s")
from foldmill.bench._inputs import load_features  # noqa: E402
from foldmill.model.boltz2 import Boltz2  # noqa: E402
from foldmill.model.config import Boltz2Config, InferenceRecipe  # noqa: E402
from foldmill.model.demo import randomize_weights  # noqa: E402
from foldmill.model.fastpath import TRAINING_ONLY_FEATURES, FastBoltz2  # noqa: E402

mark("import_foldmill_s")
model = Boltz2(Boltz2Config())
mark("construct_s")
randomize_weights(model, 0)
mark("randomize_weights_s")
fast = FastBoltz2(model.eval(), device=torch.device("cuda"))
torch.cuda.synchronize()
mark("fast_path_runner_s")
recipe = InferenceRecipe(recycling_steps=3, sampling_steps=200, diffusion_samples=5, max_parallel_samples=5, seed=0)
report["predict"] = []
for name in ("1000", "1000", "1700", "1000"):
    features = load_features(Path(sys.argv[2]) / f"features_{name}.npz", "cuda")
    features = {key: value for key, value in features.items() if key not in TRAINING_ONLY_FEATURES}
    torch.cuda.synchronize()
    begin = time.perf_counter()
    fast.predict(features, recipe)
    torch.cuda.synchronize()
    row = {"input": name, "wall_s": round(time.perf_counter() - begin, 2), **{k: round(v, 2) for k, v in fast.stage_seconds.items()}}
    report["predict"].append(row)
    print(json.dumps(row), flush=True)
    del features
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
(out / "startup_and_first_target.json").write_text(json.dumps(report, indent=1))
