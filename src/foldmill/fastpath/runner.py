"""GPU inference runner around a `Boltz2`: bf16 networks, kernel selection, token padding, CUDA graphs.

    fast = FastBoltz2(model)                              # FastPathOptions() defaults
    out = fast.predict(features, InferenceRecipe(diffusion_samples=5))
    fast.stage_seconds                                    # trunk / conditioning / diffusion / confidence

`predict` returns what `Boltz2.predict` returns (floating outputs as fp32) and runs the same
stages in the same order, from the model's own modules; what it changes:

- precision: trunk (input embedding, templates, MSA, pairformer), distogram/B-factor heads,
  diffusion conditioning and confidence run from a copy of the model whose linear weights are
  stored in bf16 (no per-call weight casts; triangle multiplication keeps fp32 weights, which
  cuEquivariance reads itself) and whose LayerNorms compute in fp32 and return bf16, under bf16
  autocast (the copies are made by foldmill.fastpath.prepare, whose docstring lists its passes). The trunk's s/z residual stream is
  stored in `trunk_residual` precision between blocks: fp32 (default; OSS Boltz-2's numerics,
  whose z is fp32 under bf16 autocast) or bf16 (half the pair memory and traffic). The diffusion sampler (noise
  schedule, noise, random augmentation, rigid alignment, Euler steps, coordinates) stays fp32.
  The score model runs from a copy whose linear weights are stored in bf16 (no per-step weight
  casts), with its coordinate- and noise-facing layers (Fourier embedding of the noise level,
  r_to_q_trans, the final position projection) kept in fp32.
- kernels: foldmill.kernels picks cuEquivariance / SDPA / Triton / reference per op and size; and
  sampling runs foldmill.fastpath.sampler's device-only steps over the restructured score model
  (foldmill.fastpath.score: per-run and per-record work hoisted out of the steps, fused layers).
- token padding to a multiple of `pad_tokens_to` (outputs cropped back).
- CUDA graphs: the whole sampling step (kernels on) or the score-model call (kernels off) is
  captured per shape and replayed for every step (foldmill.fastpath.cuda_graphs), and dropped when
  the sampling run ends (it reads that run's conditioning in place), up to
  `max_graph_tokens` tokens; the trunk's pairformer pass
  (64 blocks, same shapes every recycle) likewise up to `max_trunk_graph_tokens`; beyond, eager. The
  confidence module's pairformer can be graphed too (`max_confidence_graph_tokens`), off by default:
  measured, it does not pay.
- memory: above `sequential_confidence_tokens` tokens the confidence module scores one sample at
  a time; the diffusion conditioning stays in the compute dtype (the token transformer's bias is
  (T, T, 384): 25.7 GiB in bf16 at 6,000 tokens), built by blocks of token rows, and the graphed
  score model reads it in place (no static copy).

The weights are those of `model` when the runner is built; build a new runner after loading others.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from foldmill import kernels
from foldmill.fastpath.cuda_graphs import GraphedCall
from foldmill.fastpath.padding import crop_token_outputs, pad_token_features
from foldmill.fastpath.prepare import PrepareOptions, prepare
from foldmill.fastpath.sampler import FastSampler
from foldmill.fastpath.score import ScorePlan
from foldmill.model.boltz2 import Boltz2, TrunkOutput, sampling_generator
from foldmill.model.config import InferenceRecipe
from foldmill.model.diffusion_conditioning import DiffusionConditioningOutput

TRAINING_ONLY_FEATURES = frozenset({"disto_target"})


def inference_features(features: dict[str, Tensor]) -> dict[str, Tensor]:
    """`features` without the training-only ones: the distogram target (tokens^2 x 64 fp32, 577 MiB at
    1,537 tokens) is read by nothing at inference."""
    return {name: value for name, value in features.items() if name not in TRAINING_ONLY_FEATURES}
_PRECISIONS = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class FastPathOptions:
    precision: str = "bf16"  # network precision: bf16, fp16 or fp32 (no autocast)
    score_precision: str | None = None  # the diffusion score model's precision (None: `precision`)
    kernels: bool = True  # foldmill.kernels selection (False: the PyTorch reference everywhere)
    pad_tokens_to: int = 8  # 1 disables padding
    cuda_graphs: bool = True
    # Sampling-step graphs only up to this many (padded) tokens. Above, a graph did not pay on the H200
    # (diffusion of 2,467 / 2,556 tokens took 7.59 / 7.86 s graphed, 7.44 / 7.67 eager).
    max_graph_tokens: int = 2048
    # Trunk pairformer-pass graphs: below ~500 tokens a block (~100 kernels) is launch-bound (150 tokens:
    # 4.5 ms/block on the H200); at 1000 tokens a block takes 35 ms of GPU time, so a graph gains
    # little there while its memory pool (the pass's working set) stays reserved through diffusion.
    max_trunk_graph_tokens: int = 512
    # The confidence module's pairformer likewise, up to this many tokens (0: never). Off by default: on
    # the H200 (full-size model, 5 samples batched) a replay took what the eager stack takes, 0.041 s at
    # 150 tokens and 0.121 s at 297, while each new shape's capture cost 0.33-3.0 s.
    max_confidence_graph_tokens: int = 0
    trunk_residual: str = "fp32"  # s/z storage between trunk blocks: fp32 (OSS's numerics) or bf16
    graph_capacity: int = 4  # graphs kept (LRU)
    # Above this, confidence scores one sample at a time: batching 5 samples at 700 tokens peaked at
    # 15.1 GiB (OSS, sequential: 6.6) for 0.1 s less (H200); at 150 tokens it saves 0.2 s of 0.3.
    sequential_confidence_tokens: int = 512

    def __post_init__(self) -> None:
        for value in (self.precision, self.score_precision or self.precision, self.trunk_residual):
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

    @property
    def compute_dtypes(self) -> frozenset[torch.dtype]:
        """The dtypes the runner's kernels compute in: the network's and the score model's."""
        return frozenset({self.dtype, self.score_dtype})

    @property
    def prepare_options(self) -> PrepareOptions:
        return PrepareOptions(
            dtype=self.dtype,
            score_dtype=self.score_dtype,
            kernels=self.kernels,
            cuda_graphs=self.cuda_graphs,
            max_trunk_graph_tokens=self.max_trunk_graph_tokens,
            max_confidence_graph_tokens=self.max_confidence_graph_tokens,
            graph_capacity=self.graph_capacity,
        )

    @property
    def residual_dtype(self) -> torch.dtype | None:
        """The trunk's residual dtype; None for an fp32 network (the reference computation, untouched)."""
        return None if self.dtype == torch.float32 else _PRECISIONS[self.trunk_residual]


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

    def __init__(
        self, model: Boltz2, options: FastPathOptions | None = None, device: torch.device | str | None = None
    ) -> None:
        """`device`: where the runner runs (default: the model's). A model elsewhere (on the CPU, say)
        stays there and untouched: only the runner's copies of its weights go to `device`, so an
        fp32 master copy costs no device memory."""
        self.model = model.eval()
        self.options = options or FastPathOptions()
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        networks = prepare(model, self.options.prepare_options, self.device)
        self.network, self.score_model, self.fast_score = networks.network, networks.score_model, networks.fast_score
        # With kernels on, sampling runs foldmill.fastpath.sampler's device-only steps over the fused
        # score model, a whole step per graph replay; off, the reference sampler with the score-model call
        # replayed from a graph.
        self.sampler: FastSampler | None = None
        if self.fast_score is not None:
            self.sampler = FastSampler(self.network.structure_module, self.fast_score, self._run_fast_score)
            self.graphs = GraphedCall(self.sampler.step, per_call=(True, True, False), capacity=self.options.graph_capacity)
        else:
            self.graphs = GraphedCall(
                self._run_score_model,
                per_call=(True, True, False, False, False, False),
                capacity=self.options.graph_capacity,
            )
        self.stage_seconds: dict[str, float] = {}
        if self.options.kernels:
            kernels.load_backends(self.device, self.options.compute_dtypes)

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

    def _run_fast_score(self, r_noisy: Tensor, times: Tensor, plan: ScorePlan) -> Tensor:
        with self._autocast(r_noisy.device, self.options.score_dtype, cache=False):
            return self.fast_score(r_noisy, times, plan)

    def _graphed(self, feats: dict[str, Tensor]) -> bool:
        """Whether sampling replays CUDA graphs for these (padded) features."""
        token_mask = feats["token_pad_mask"]
        return self.options.cuda_graphs and token_mask.is_cuda and token_mask.shape[1] <= self.options.max_graph_tokens

    def sample(
        self,
        trunk: TrunkOutput,
        feats: dict[str, Tensor],
        conditioning: DiffusionConditioningOutput,
        recipe: InferenceRecipe,
    ) -> Tensor:
        """The recipe's diffusion samples (B * samples, atoms, 3): Boltz2.sample_structure's, from the same
        generator draws; the conditioning is the sampler's from here on (see foldmill.fastpath.score)."""
        try:
            if self.sampler is None:
                # the score model replayed from a CUDA graph where possible
                score = self.graphs if self._graphed(feats) else self._run_score_model
                return self.network.sample_structure(trunk, feats, conditioning, recipe, score)
            generator = sampling_generator(recipe.seed, trunk.s.device)
            step = self.graphs if self._graphed(feats) else None
            s_trunk, s_inputs = trunk.s.float(), trunk.s_inputs.float()
            return self.sampler.sample(s_trunk, s_inputs, feats, conditioning, recipe, generator, step)
        finally:
            # A sampling graph reads its run's conditioning in place: no later run replays it (its tensors
            # live elsewhere), and kept it would hold them (the token bias alone is 0.75 GiB at 1,000
            # tokens) and its memory pool through confidence and every later target.
            self.graphs.clear()

    @torch.no_grad()
    def predict(self, features: dict[str, Tensor], recipe: InferenceRecipe) -> dict[str, Tensor]:
        """Boltz2.predict's outputs (see foldmill.model.boltz2), floating ones in fp32."""
        model, options = self.network, self.options
        # The distogram training target (9.2 GB at 6,000 tokens) is not padded, not passed on.
        features = inference_features(features)
        feats, num_tokens = pad_token_features(features, options.pad_tokens_to)
        device = feats["token_pad_mask"].device
        clock = _StageClock(device)
        clock.mark("start")
        # The low-precision copy's weights need no cast cache (and a cast cached while a graph
        # captures would outlive the capture's memory pool).
        cache_casts = model is self.model
        with kernels.kernel_policy(enabled=options.kernels):
            with self._autocast(device, cache=cache_casts):
                trunk = model.trunk(feats, recipe.recycling_steps, options.residual_dtype)
                clock.mark("trunk")
                out = model.trunk_heads(trunk)
                conditioning = model.diffusion_conditioning(trunk.s, trunk.z, trunk.relative_position_encoding, feats)
                # (B, T, T, token_z), unused from here on: free it before sampling
                trunk.relative_position_encoding = None  # type: ignore[assignment]
                clock.mark("conditioning")
            out["sample_atom_coords"] = self.sample(trunk, feats, conditioning, recipe)
            clock.mark("diffusion")
            del conditioning
            confidence_recipe = recipe
            if num_tokens > options.sequential_confidence_tokens:
                confidence_recipe = dataclasses.replace(recipe, max_parallel_samples=1)
            with self._autocast(device, cache=cache_casts):
                out.update(
                    model.confidence(trunk, out["sample_atom_coords"], out["pdistogram"], feats, confidence_recipe)
                )
            clock.mark("confidence")
        self.stage_seconds = clock.seconds()
        out = {name: value.float() if value.is_floating_point() else value for name, value in out.items()}
        return crop_token_outputs(out, num_tokens)
