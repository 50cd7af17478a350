"""The three stages of a fold, as the executor's actors run them: featurize -> model -> write.

- `FeaturizeStage`: a work item (Target JSON) -> `FoldInput`, its features packed for the trip
  (CPU actors).
- `Engine`: one model replica; `FoldInput` -> `Prediction` (one per GPU, or CPU replicas). Out of
  memory, it retries with samples denoised one at a time, then rejects the target.
- `WriteStage`: `Prediction` -> OUTDIR/predictions/<target_id>/ (CPU actors).
Each stage is built once per actor (the model is loaded once, not per target).
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from foldmill import __version__, kernels
from foldmill.errors import FoldmillError, is_out_of_memory
from foldmill.executor.faults import TargetRejected
from foldmill.executor.plan import WorkItem
from foldmill.executor.settings import ModelSettings
from foldmill.executor.transfer import PackedTensor, pack_features, unpack_features
from foldmill.fastpath.runner import FastBoltz2, FastPathOptions, inference_features
from foldmill.features import FeaturizedTarget, StagedInputs, featurize
from foldmill.io.targets import Entity, Target
from foldmill.model.checkpoint import file_sha256
from foldmill.model.config import Boltz2Config, InferenceRecipe
from foldmill.outputs.prediction import Prediction
from foldmill.outputs.writer import write_prediction
from foldmill.vocab import PROTEIN_LETTERS

log = logging.getLogger(__name__)

# Peak memory of one forward grows with the token pairs: per pair, about BYTES_PER_PAIR_CHANNEL per
# pair channel (token_z) plus BYTES_PER_PAIR for the fixed-width pair features (relative-position
# and distance-bin one-hots, PAE/PDE logits), plus the weights and a fixed working set. Calibrated
# on OSS Boltz-2 on an H200 in bf16 (12.8 GiB at 1,024 tokens, 26.3 GiB at 1,536, token_z 128) and
# on foldmill's fp32 CPU path (8.9 GB at 1,537 tokens with token_z 8); errs on the large side.
BYTES_PER_PAIR_CHANNEL = 80
BYTES_PER_PAIR = 3200
FIXED_BYTES = 2 << 30
MEMORY_HEADROOM = 0.9
DEMO_WEIGHTS_SEED = 0  # the demo model is one fixed set of weights; recipe.seed only seeds sampling
KERNEL_CACHE_DIRNAME = ".kernel-cache"


def kernel_cache_dir(settings: ModelSettings, outdir: Path) -> Path:
    """Where a run's replicas keep compiled GPU kernels: model.kernel_cache, else OUTDIR/.kernel-cache."""
    return Path(settings.kernel_cache) if settings.kernel_cache else Path(outdir) / KERNEL_CACHE_DIRNAME


def use_kernel_cache(directory: Path | None) -> None:
    """Point this process's Triton cache (cuEquivariance's triangle kernels are Triton too) at `directory`
    before anything compiles, unless TRITON_CACHE_DIR is set already (the environment decides).

    Why: a replica on a node with a cold cache spends ~36 s compiling at its first target (H200,
    54.5 s against 8.5 s for the next, ~7-10 s of which remain with a warm cache); with a
    directory shared by a run's jobs, only the first one does. Triton writes its
    cache entries atomically, so concurrent replicas can share one. The cache only saves time, so a
    directory that cannot be created is a warning (Triton's default cache is used), not a failed run.
    """
    if directory is None or os.environ.get("TRITON_CACHE_DIR"):
        return
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        log.warning("model.kernel_cache %s: cannot create it (%s); using Triton's default cache", directory, error.strerror)
        return
    os.environ["TRITON_CACHE_DIR"] = str(directory)


@dataclass(frozen=True)
class Staging:
    """Where featurizers find staged MSAs and templates: OUTDIR/staged of a workflow run, or None to
    read each target's own MSA files (and align its templates) as `foldmill fold` does on input files."""

    staged_dir: Path | None = None


def recipe_provenance(recipe: InferenceRecipe) -> dict[str, int]:
    """The recipe fields that change a prediction (max_parallel_samples only trades memory for speed)."""
    return {k: v for k, v in asdict(recipe).items() if k not in ("max_parallel_samples", "seed")}


def model_id(settings: ModelSettings) -> str:
    """'demo' or the checkpoint's sha256: what the outputs name as the model."""
    return "demo" if settings.is_demo else file_sha256(Path(settings.checkpoint))


def run_provenance(settings: ModelSettings) -> dict[str, Any]:
    """What every prediction of this run records, and what a finished one must match to be skipped."""
    provenance = {"model": model_id(settings), "seed": settings.recipe.seed, "recipe": recipe_provenance(settings.recipe)}
    if settings.is_demo:
        provenance["demo_config"] = dict(sorted(settings.demo_config.items()))
        provenance["demo_weights_device"] = torch.device(settings.device).type  # drawn there: CPU and GPU differ
    return provenance


@dataclass
class FoldInput:
    """A featurized target on its way to a replica: its features packed (see executor.transfer), the
    rest of the FeaturizedTarget (features emptied), and the content hash and origin its outputs record."""

    featurized: FeaturizedTarget
    features: dict[str, PackedTensor]
    content_hash: str
    input_source: str = ""  # the input file and record the target came from (see plan.id_conflict)
    input_record: str = ""


class FeaturizeStage:
    def __init__(self, staging: Staging, model: ModelSettings) -> None:
        self.staged_dir = staging.staged_dir
        self.seed = model.recipe.seed
        self.max_msa_seqs = model.max_msa_seqs
        # Build the amino acids' reference components (CCD lookup, RDKit: ~3 s) now, while the
        # replicas load their models, not during the first target, which a GPU waits for.
        featurize(Target("warm-up", (Entity("protein", ("A",), "".join(PROTEIN_LETTERS), msa="empty"),)))

    def __call__(self, item: WorkItem) -> FoldInput:
        target = Target.from_json(item.spec)
        if self.staged_dir is None:
            staged = StagedInputs.from_target(target)
        else:
            staged = StagedInputs.from_manifests(self.staged_dir, target)
        featurized = featurize(target, staged, seed=self.seed, max_msa_seqs=self.max_msa_seqs)
        # Packing, sending and unpacking the distogram training target cost seconds per long target.
        packed = pack_features(inference_features(featurized.features))
        return FoldInput(replace(featurized, features={}), packed, item.content_hash, target.source, target.record)


class Engine:
    """One model replica on one device: the fast path on a GPU, the fp32 reference path on CPUs."""

    def __init__(
        self,
        settings: ModelSettings,
        token_budget: int = 0,
        memory_share: float = 1.0,
        run: dict[str, Any] | None = None,
        kernel_cache: Path | None = None,
    ) -> None:
        """`run`: the run's provenance when the caller has it (hashing a 2 GB checkpoint again costs seconds);
        `kernel_cache`: see use_kernel_cache (None: Triton's own default)."""
        use_kernel_cache(kernel_cache)
        self.device = torch.device(settings.device)
        self.recipe = settings.recipe
        clock = time.perf_counter()
        self.model = load_model(settings, self.device).eval()
        self.build_seconds = {"model": time.perf_counter() - clock}  # what the replica's start-up went to
        self.runner: FastBoltz2 | torch.nn.Module
        if self.device.type == "cuda" and settings.fast_path:
            clock = time.perf_counter()
            options = FastPathOptions()
            kernels.load_backends(self.device, options.compute_dtypes)  # the runner would; timed apart
            self.build_seconds["kernel imports"] = time.perf_counter() - clock
            clock = time.perf_counter()
            # The GPU holds only the runner's bf16 copies; the fp32 weights go (or stay) in host memory.
            self.runner = FastBoltz2(self.model, options, device=self.device)
            self.model.cpu()
            torch.cuda.empty_cache()  # the freed fp32 weights count as free memory for the token budget
        else:
            clock = time.perf_counter()
            self.runner = self.model.to(self.device)
        self.build_seconds["runner"] = time.perf_counter() - clock
        self.stage_seconds: dict[str, float] = {}  # of the latest target: trunk, diffusion, ... (fast path)
        self.provenance = {
            **self.model.provenance,
            **(run or run_provenance(settings)),
            "device": torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu",
            "foldmill_version": __version__,
        }
        self.token_budget = token_budget or self.estimated_token_budget(memory_share)

    def estimated_token_budget(self, memory_share: float) -> int:
        """Largest target that should fit in this replica's share of device memory (CPU replicas
        share the host's); the out-of-memory fallback covers what the estimate misses."""
        if self.device.type == "cuda":
            free_bytes, _ = torch.cuda.mem_get_info(self.device)
        else:
            free_bytes = _available_host_memory()
        weights = sum(p.numel() * p.element_size() for p in self.model.parameters())
        usable = MEMORY_HEADROOM * free_bytes * memory_share - weights - FIXED_BYTES
        per_pair = BYTES_PER_PAIR_CHANNEL * self.model.config.token_z + BYTES_PER_PAIR
        return max(0, int(math.sqrt(max(usable, 0) / per_pair)))

    def __call__(self, job: FoldInput) -> Prediction:
        started = time.perf_counter()
        featurized = job.featurized
        features = unpack_features(job.features, self.device)
        output = self._predict(features, featurized.n_tokens)
        del features
        origin = {"content_hash": job.content_hash, "input_source": job.input_source, "input_record": job.input_record}
        prediction = to_prediction(featurized, output, {**self.provenance, **origin})
        prediction.runtime_seconds = time.perf_counter() - started
        return prediction

    def _predict(self, features: dict[str, torch.Tensor], n_tokens: int) -> dict[str, torch.Tensor]:
        """The model's outputs; out of memory, retry with one sample at a time, then reject."""
        recipes = [self.recipe]
        if self.recipe.max_parallel_samples > 1 and self.recipe.diffusion_samples > 1:
            recipes.append(replace(self.recipe, max_parallel_samples=1))
        for attempt, recipe in enumerate(recipes):
            try:
                with torch.inference_mode():
                    output = self.runner.predict(features, recipe)
                self.stage_seconds = dict(getattr(self.runner, "stage_seconds", {}))
                return output
            except Exception as error:  # noqa: BLE001 - only out-of-memory is handled here
                if not is_out_of_memory(error):
                    raise
                log.warning("out of memory at %d tokens (attempt %d of %d)", n_tokens, attempt + 1, len(recipes))
            # Outside the except block, so the traceback (and the tensors its frames hold) is gone.
            _release_memory(self.device)
        raise TargetRejected(
            f"out of memory ({n_tokens} tokens; {self.device.type} memory, even denoising one sample at a time)"
        )


def load_model(settings: ModelSettings, device: torch.device) -> torch.nn.Module:
    """The checkpoint's model on the host, or the demo model made on `device` (its weights drawn there:
    on the H200 the full-size one took 8 s on the host, most of a replica's start-up)."""
    from foldmill.model.boltz2 import Boltz2
    from foldmill.model.demo import demo_model

    if settings.is_demo:
        try:
            config = Boltz2Config.small(**settings.demo_config)
        except TypeError as error:
            raise FoldmillError(f"config model.demo_config: {error}") from None
        return demo_model(config, seed=DEMO_WEIGHTS_SEED, device=device)
    return Boltz2.from_checkpoint(settings.checkpoint)


def to_prediction(featurized: FeaturizedTarget, output: dict[str, torch.Tensor], provenance: dict[str, Any]) -> Prediction:
    """Unpad the model's outputs (real atoms and tokens come first) into a host-side Prediction."""
    n_atoms, n_tokens = featurized.n_atoms, featurized.n_tokens

    def host(name: str, *index: slice) -> np.ndarray:
        return output[name][(slice(None), *index)].float().cpu().numpy()

    tokens = slice(0, n_tokens)
    return Prediction(
        target_id=featurized.target_id,
        atoms=featurized.atoms,
        sequences=featurized.sequences,
        token_chain_ids=np.asarray(featurized.token_chain_ids),
        coords=host("sample_atom_coords", slice(0, n_atoms)),
        plddt=host("plddt", tokens),
        pae=host("pae", tokens, tokens),
        pde=host("pde", tokens, tokens),
        ptm=host("ptm"),
        iptm=host("iptm"),
        ligand_iptm=host("ligand_iptm"),
        protein_iptm=host("protein_iptm"),
        complex_plddt=host("complex_plddt"),
        complex_iplddt=host("complex_iplddt"),
        complex_pde=host("complex_pde"),
        complex_ipde=host("complex_ipde"),
        chains_ptm=host("chains_ptm"),
        pair_chains_iptm=host("pair_chains_iptm"),
        provenance=provenance,
    )


class WriteStage:
    def __init__(self, outdir: Path, top_k: int | None, write_pdb: bool) -> None:
        self.outdir = Path(outdir)
        self.top_k = top_k
        self.write_pdb = write_pdb

    def __call__(self, prediction: Prediction) -> str:
        return str(write_prediction(prediction, self.outdir, top_k=self.top_k, write_pdb=self.write_pdb))


def _available_host_memory() -> int:
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


def _release_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
