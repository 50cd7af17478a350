"""Settings of a fold run: which model and recipe (`model:` in the config) and how the executor runs it (`executor:`).

Both are plain frozen dataclasses so they travel to Ray actors unchanged. `model_settings` and
`executor_settings` read the workflow config sections (defaults come from
workflow/schemas/config.schema.yaml; the dataclass defaults are the same values, for library and
CLI use). The recipe is the model's own `InferenceRecipe`, seeded (0) unless the config says otherwise.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from typing import Any

from foldmill.errors import FoldmillError
from foldmill.model.config import InferenceRecipe

DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class ModelSettings:
    checkpoint: str = "demo"  # path to boltz2_conf.ckpt, or "demo" for the seeded random-weight model
    device: str = "cuda"
    recipe: InferenceRecipe = field(default_factory=lambda: InferenceRecipe(seed=0))
    max_msa_seqs: int = 8192
    fast_path: bool = True  # on cuda: foldmill.fastpath.runner (bf16, kernels, CUDA graphs); false = fp32 reference
    # Compiled GPU kernels (Triton's cache) shared by a run's jobs: "" = OUTDIR/.kernel-cache (see kernel_cache_dir).
    kernel_cache: str = ""
    # Architecture of the demo model: Boltz2Config fields changed from Boltz2Config.small()
    # (e.g. pairformer_blocks: 0 for a demo that runs in minutes on two CPU cores).
    demo_config: dict[str, Any] = field(default_factory=dict)

    @property
    def is_demo(self) -> bool:
        return self.checkpoint == "demo"


@dataclass(frozen=True)
class ExecutorSettings:
    address: str | None = None  # Ray cluster to join; None = RAY_ADDRESS, else a local instance
    cpus: int = 0  # CPUs of a local Ray instance (0 = every core this process may use)
    gpus: int = 0  # GPUs of a local Ray instance (0 = every visible GPU)
    cpu_replicas: int = 1  # model replicas when device is cpu
    cpu_workers: int = 1  # featurize actors, and as many writer actors
    queue_depth: int = 2  # featurized targets kept ready per replica
    token_budget: int = 0  # largest target a replica accepts, in tokens (0 = estimate from device memory)
    max_attempts: int = 3  # replica crashes a target may cause before it is failed
    object_store_mb: int = 0  # object store of a local Ray instance (0 = Ray's default)
    progress_seconds: float = 30.0  # interval of progress lines when stderr is not a terminal

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
    recipe = _build(InferenceRecipe, {"seed": 0, **dict(section.pop("recipe", None) or {})}, "model.recipe")
    settings = replace(_build(ModelSettings, section, "model"), recipe=recipe)
    if settings.device not in DEVICES:
        raise FoldmillError(f"config model.device: {settings.device!r} is not one of {', '.join(DEVICES)}")
    return settings


def executor_settings(section: dict[str, Any] | None) -> ExecutorSettings:
    """ExecutorSettings from the config's `executor:` section."""
    return _build(ExecutorSettings, dict(section or {}), "executor")
