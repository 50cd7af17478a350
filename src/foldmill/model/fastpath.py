"""GPU inference runner around a `Boltz2`: bf16 networks, kernel selection, token padding, CUDA graphs.

    fast = FastBoltz2(model)                              # FastPathOptions() defaults
    out = fast.predict(features, InferenceRecipe(diffusion_samples=5))
    fast.stage_seconds                                    # trunk / conditioning / diffusion / confidence

`predict` returns what `Boltz2.predict` returns (floating outputs as fp32) and runs the same
stages in the same order, from the model's own modules; what it changes:

- precision: trunk (input embedding, templates, MSA, pairformer), distogram/B-factor heads,
  diffusion conditioning and confidence run under bf16 autocast. The diffusion sampler (noise
  schedule, noise, random augmentation, rigid alignment, Euler steps, coordinates) stays fp32.
  The score model runs from a copy whose linear weights are stored in bf16 (no per-step weight
  casts), with its coordinate- and noise-facing layers (Fourier embedding of the noise level,
  r_to_q_trans, the final position projection) kept in fp32.
- kernels: foldmill.kernels picks cuEquivariance / SDPA / reference per op and size.
- token padding to a multiple of `pad_tokens_to` (outputs cropped back).
- CUDA graphs: the score-model call is captured per shape and replayed for every sampling step
  (foldmill.kernels.cuda_graphs), up to `max_graph_tokens` tokens; beyond, eager.
- memory: above `sequential_confidence_tokens` tokens the confidence module scores one sample at
  a time; diffusion conditioning is converted to fp32 once (not every step) while it is small,
  the token transformer's bias stored layer-major (`layer_major`).

The weights are those of `model` when the runner is built; build a new runner after loading others.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from foldmill import kernels
from foldmill.kernels.cuda_graphs import GraphedCall
from foldmill.kernels.padding import crop_token_outputs, pad_token_features
from foldmill.model.boltz2 import Boltz2, _generator  # the sampler's seeding, exactly as Boltz2.predict
from foldmill.model.config import InferenceRecipe
from foldmill.model.diffusion import DiffusionModule
from foldmill.model.diffusion_conditioning import DiffusionConditioningOutput

# Score-model layers that see coordinates or the noise level directly: kept in fp32.
FP32_SCORE_LAYERS = (
    "single_conditioner.fourier_embed",
    "atom_attention_encoder.r_to_q_trans",
    "atom_attention_decoder.atom_feat_to_atom_pos_update",
)
_PRECISIONS = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class FastPathOptions:
    precision: str = "bf16"  # network precision: bf16, fp16 or fp32 (no autocast)
    score_precision: str | None = None  # the diffusion score model's precision (None: `precision`)
    kernels: bool = True  # foldmill.kernels selection (False: the PyTorch reference everywhere)
    pad_tokens_to: int = 8  # 1 disables padding
    cuda_graphs: bool = True
    max_graph_tokens: int = 2048  # score-model graphs only up to this many (padded) tokens
    graph_capacity: int = 4  # graphs kept (LRU)
    # Above this, confidence scores one sample at a time: batching 5 samples at 700 tokens peaked at
    # 15.1 GiB (OSS, sequential: 6.6) for 0.1 s less (H200); at 150 tokens it saves 0.2 s of 0.3.
    sequential_confidence_tokens: int = 512
    float32_conditioning_bytes: int = 8 << 30  # convert conditioning to fp32 once while at most this big

    def __post_init__(self) -> None:
        for value in (self.precision, self.score_precision or self.precision):
            if value not in _PRECISIONS:
                raise ValueError(f"precision must be one of {sorted(_PRECISIONS)}, got {value!r}")
        if self.pad_tokens_to < 1:
            raise ValueError("pad_tokens_to must be >= 1")

    @property
    def dtype(self) -> torch.dtype:
        return _PRECISIONS[self.precision]

    @property
    def score_dtype(self) -> torch.dtype:
        return _PRECISIONS[self.score_precision or self.precision]


class _Float32(nn.Module):
    """Runs the wrapped module in fp32 with autocast off, whatever the surrounding precision."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: Tensor) -> Tensor:
        with torch.autocast(x.device.type, enabled=False):
            return self.module(x.float())


def low_precision_score_model(score_model: DiffusionModule, dtype: torch.dtype) -> DiffusionModule:
    """A copy of the score model with linear weights in `dtype`, FP32_SCORE_LAYERS wrapped in fp32."""
    clone = copy.deepcopy(score_model)
    for name in FP32_SCORE_LAYERS:
        parent_name, _, attribute = name.rpartition(".")
        parent = clone.get_submodule(parent_name)
        setattr(parent, attribute, _Float32(getattr(parent, attribute)))
    keep = {id(m) for wrapper in clone.modules() if isinstance(wrapper, _Float32) for m in wrapper.modules()}
    for module in clone.modules():
        if isinstance(module, nn.Linear) and id(module) not in keep:
            module.to(dtype)
    return clone.eval()


def layer_major(bias: Tensor, depth: int) -> Tensor:
    """The token transformer's bias (B, L, K, depth * H), same shape and values, stored so that each
    layer's (H, L, K) block is contiguous: the transformer slices one layer and moves heads first,
    which on the default layout is a strided gather of the whole tensor per layer and step."""
    batch, queries, keys, channels = bias.shape
    storage = bias.view(batch, queries, keys, depth, channels // depth).permute(0, 3, 4, 1, 2).contiguous()
    return storage.permute(0, 3, 4, 1, 2).view(batch, queries, keys, channels)


def _prepared_conditioning(conditioning: DiffusionConditioningOutput, depth: int) -> DiffusionConditioningOutput:
    """fp32 (once, instead of an upcast in every step) and the token bias in layer-major storage."""
    prepared = {f.name: getattr(conditioning, f.name).float() for f in dataclasses.fields(conditioning)}
    prepared["token_trans_bias"] = layer_major(prepared["token_trans_bias"], depth)
    return dataclasses.replace(conditioning, **prepared)


def _conditioning_bytes(conditioning: DiffusionConditioningOutput) -> int:
    return sum(getattr(conditioning, f.name).numel() * 4 for f in dataclasses.fields(conditioning))


class _StageClock:
    """Seconds per stage; on CUDA measured with events (one synchronisation at the end)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list[tuple[str, object]] = []

    def mark(self, name: str) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append((name, event))
        else:
            import time

            self.marks.append((name, time.perf_counter()))

    def seconds(self) -> dict[str, float]:
        if self.cuda:
            torch.cuda.synchronize()
        out = {}
        for (_, start), (name, stop) in zip(self.marks, self.marks[1:]):
            out[name] = start.elapsed_time(stop) / 1000 if self.cuda else stop - start  # type: ignore[attr-defined,operator]
        return out


class FastBoltz2:
    """Fast inference with a Boltz2's weights (see the module docstring)."""

    def __init__(self, model: Boltz2, options: FastPathOptions | None = None) -> None:
        self.model = model.eval()
        self.options = options or FastPathOptions()
        score_model = model.structure_module.score_model
        if self.options.score_dtype != torch.float32:
            score_model = low_precision_score_model(score_model, self.options.score_dtype)
        self.score_model = score_model
        self.graphs = GraphedCall(
            self._run_score_model,
            per_call=(True, True, False, False, False, False),
            capacity=self.options.graph_capacity,
        )
        self.stage_seconds: dict[str, float] = {}

    def _autocast(
        self, device: torch.device, dtype: torch.dtype | None = None, cache: bool = True
    ) -> contextlib.AbstractContextManager:
        dtype = dtype or self.options.dtype
        if dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=dtype, cache_enabled=cache)

    def _run_score_model(
        self,
        r_noisy: Tensor,
        times: Tensor,
        embedded_trunk: Tensor,
        feats: dict[str, Tensor],
        conditioning: DiffusionConditioningOutput,
        multiplicity: int,
    ) -> Tensor:
        # No weight-cast cache (the copy's weights are low precision already, and a cast cached
        # during graph capture would outlive the capture's memory pool).
        with self._autocast(r_noisy.device, self.options.score_dtype, cache=False):
            return self.score_model(
                r_noisy=r_noisy,
                times=times,
                embedded_trunk=embedded_trunk,
                feats=feats,
                conditioning=conditioning,
                multiplicity=multiplicity,
            ).float()

    def _denoise(
        self,
        noisy: Tensor,
        sigma: float,
        embedded_trunk: Tensor,
        feats: dict[str, Tensor],
        conditioning: DiffusionConditioningOutput,
        multiplicity: int,
    ) -> Tensor:
        """AtomDiffusion.denoise with the score model replayed from a CUDA graph where possible."""
        diffusion = self.model.structure_module
        sigma_rows = torch.full((noisy.shape[0],), sigma, device=noisy.device)
        padded_sigma = sigma_rows[:, None, None]
        graphed = (
            self.options.cuda_graphs
            and noisy.is_cuda
            and feats["token_pad_mask"].shape[1] <= self.options.max_graph_tokens
        )
        score = self.graphs if graphed else self._run_score_model
        update = score(
            diffusion.c_in(padded_sigma) * noisy,
            diffusion.c_noise(sigma_rows),
            embedded_trunk,
            feats,
            conditioning,
            multiplicity,
        )
        return diffusion.c_skip(padded_sigma) * noisy + diffusion.c_out(padded_sigma) * update

    @contextlib.contextmanager
    def _fast_denoiser(self) -> Iterator[None]:
        """AtomDiffusion has no denoiser hook: its `denoise` is shadowed on the instance for one sampling run."""
        diffusion = self.model.structure_module
        diffusion.denoise = self._denoise  # type: ignore[method-assign]
        self.graphs.new_generation()
        try:
            yield
        finally:
            del diffusion.denoise

    @torch.no_grad()
    def predict(self, features: dict[str, Tensor], recipe: InferenceRecipe) -> dict[str, Tensor]:
        """Boltz2.predict's outputs (see foldmill.model.boltz2), floating ones in fp32."""
        model, options = self.model, self.options
        feats, num_tokens = pad_token_features(features, options.pad_tokens_to)
        device = feats["token_pad_mask"].device
        clock = _StageClock(device)
        clock.mark("start")
        with kernels.kernel_policy(enabled=options.kernels):
            with self._autocast(device):
                trunk = model.trunk(feats, recipe.recycling_steps)
                clock.mark("trunk")
                out: dict[str, Tensor] = {"s": trunk.s, "z": trunk.z, "pdistogram": model.distogram_module(trunk.z)}
                if model.config.predict_bfactor:
                    out["pbfactor"] = model.bfactor_module(trunk.s)
                conditioning = model.diffusion_conditioning(trunk.s, trunk.z, trunk.relative_position_encoding, feats)
                clock.mark("conditioning")
            if _conditioning_bytes(conditioning) <= options.float32_conditioning_bytes:
                conditioning = _prepared_conditioning(conditioning, model.config.token_transformer_depth)
            with self._fast_denoiser():
                out["sample_atom_coords"] = model.structure_module.sample(
                    s_trunk=trunk.s.float(),
                    s_inputs=trunk.s_inputs.float(),
                    feats=feats,
                    conditioning=conditioning,
                    num_sampling_steps=recipe.sampling_steps,
                    multiplicity=recipe.diffusion_samples,
                    max_parallel_samples=recipe.max_parallel_samples,
                    generator=_generator(recipe.seed, device),
                )
            clock.mark("diffusion")
            del conditioning
            confidence_recipe = recipe
            if num_tokens > options.sequential_confidence_tokens:
                confidence_recipe = dataclasses.replace(recipe, max_parallel_samples=1)
            with self._autocast(device):
                out.update(
                    model.confidence(trunk, out["sample_atom_coords"], out["pdistogram"], feats, confidence_recipe)
                )
            clock.mark("confidence")
        self.stage_seconds = clock.seconds()
        out = {name: value.float() if value.is_floating_point() else value for name, value in out.items()}
        return crop_token_outputs(out, num_tokens)
