"""Settings of a fold run: which model and recipe (`model:` in the config) and how the executor runs it (`executor:`).

Both are plain frozen dataclasses so they travel to Ray actors unchanged. `model_settings` and
`executor_settings` read the workflow config sections (defaults come from
workflow/schemas/config.schema.yaml through foldmill.config; the dataclass defaults are the same
values, checked by tests/test_config.py). The recipe is the model's own `InferenceRecipe`, seeded (0)
unless the config says otherwise. A device `auto` is resolved when the settings are made.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from typing import Any

from foldmill.config import resolve_device
from foldmill.errors import FoldmillError
from foldmill.model.config import InferenceRecipe

DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class ModelSettings:
    checkpoint: str  # path to boltz2_conf.ckpt, or "demo" for the seeded random-weight model
    device: str = "auto"  # resolved to cuda or cpu on construction
    recipe: InferenceRecipe = field(default_factory=lambda: InferenceRecipe(seed=0))
    max_msa_seqs: int = 8192
    fast_path: bool = True  # on cuda: foldmill.fastpath.runner (bf16, kernels, CUDA graphs); false = fp32 reference
    # Compiled GPU kernels (Triton's cache) shared by a run's jobs: "" = OUTDIR/.kernel-cache (see kernel_cache_dir).
    kernel_cache: str = ""
    # Architecture of the demo model: Boltz2Config fields changed from Boltz2Config.small()
    # (e.g. pairformer_blocks: 0 for a demo that runs in minutes on two CPU cores).
    demo_config: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "device", resolve_device(self.device))
        if self.device not in DEVICES:
            raise FoldmillError(f"config model.device: {self.device!r} is not one of auto, {', '.join(DEVICES)}")

    @property
    def is_demo(self) -> bool:
        return self.checkpoint == "demo"

    def describe(self) -> str:
        """One line for the fold log: the weights, the device and the recipe."""
        weights = "demo (random weights, not real structures)" if self.is_demo else self.checkpoint
        recipe = self.recipe
        return (
            f"model {weights}, device {self.device}; recipe {recipe.recycling_steps} recycling steps, "
            f"{recipe.sampling_steps} sampling steps, {recipe.diffusion_samples} sample(s), seed {recipe.seed}"
        )

    def announcement(self) -> str:
        """The line a run starts with (console and fold log): which model, and loudly when it is no model at all."""
        if self.is_demo:
            return "model: DEMO random weights (model.checkpoint: demo) - structures are not predictions"
        return f"model: checkpoint {self.checkpoint}"


@dataclass(frozen=True)
class ExecutorSettings:
    address: str = ""  # Ray cluster to join; "" = RAY_ADDRESS, else a local instance
    cpus: int = 0  # CPUs of a local Ray instance (0 = every core this process may use)
    gpus: int = 0  # GPUs of a local Ray instance (0 = every visible GPU)
    cpu_replicas: int = 1  # model replicas when device is cpu
    cpu_workers: int = 1  # featurize actors, and as many writer actors
    queue_depth: int = 2  # featurized targets kept ready per replica
    token_budget: int = 0  # largest target a replica accepts, in tokens (0 = estimate from device memory)
    max_attempts: int = 3  # replica crashes a target may cause before it is failed
    object_store_mb: int = 0  # object store of a local Ray instance (0 = Ray's default)
    progress_seconds: float = 30.0  # interval of progress lines when stderr is not a terminal
    scratch_dir: str = ""  # temp dir of a local Ray instance ("" = OUTDIR/.ray); see cluster.ray_temp_dir

    def ray_address(self) -> str | None:
        return self.address or os.environ.get("RAY_ADDRESS") or None


def _build(cls: type, section: dict[str, Any], where: str) -> Any:
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(section) - known)
    if unknown:
        raise FoldmillError(f"config {where}: unknown key(s) {', '.join(unknown)}")
    return cls(**section)


def model_settings(section: dict[str, Any] | None) -> ModelSettings:
    """ModelSettings from the config's `model:` section."""
    section = dict(section or {})
    if not section.get("checkpoint"):
        raise FoldmillError("config model.checkpoint: missing (path to boltz2_conf.ckpt, or demo for random weights)")
    recipe = _build(InferenceRecipe, {"seed": 0, **dict(section.pop("recipe", None) or {})}, "model.recipe")
    return replace(_build(ModelSettings, section, "model"), recipe=recipe)


def executor_settings(section: dict[str, Any] | None) -> ExecutorSettings:
    """ExecutorSettings from the config's `executor:` section."""
    return _build(ExecutorSettings, dict(section or {}), "executor")
