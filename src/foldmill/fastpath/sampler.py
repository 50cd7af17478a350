"""EDM sampling for the fast path: AtomDiffusion.sample's steps, each one device-only computation.

The reference sampler (foldmill.model.diffusion.AtomDiffusion.sample) runs ~90 small PyTorch ops
per step around the score model, and its rigid alignment's SVD synchronises with the host, so
the host re-launches all of them every step while the GPU waits (measured on the H200: a 6.5 ms
step around a 3.0 ms graphed score model at 150 tokens). Here the same computation is arranged
so that a step needs nothing from the host:

- the noise schedule is kept on the device (per step: the noise level denoised at, the noise's
  standard deviation, the Euler step size), computed in float64 from the same float32 schedule;
- the random numbers are drawn ahead, RANDOM_BLOCK_STEPS steps at a time, from the same generator
  in the reference's order (rotation quaternions, translations, noise, per step), so they are the
  same numbers;
- the rigid alignment finds its rotation by quaternion_rotation (no SVD, no synchronisation; the
  same rotation to ~1e-13 in float64);
- the score model is foldmill.fastpath.score's, over the run's plans.

`FastSampler.step(coords, step, run)` is then a pure function of device tensors, which FastBoltz2
replays from one CUDA graph per shape for every step (where graphs apply; eagerly elsewhere).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from foldmill.fastpath.score import FastScoreModel, ScorePlan
from foldmill.model.config import InferenceRecipe
from foldmill.model.diffusion import (
    AtomDiffusion,
    quaternion_rotation,
    rotations_from_quaternions,
    sample_chunks,
    weighted_rigid_align,
)
from foldmill.model.diffusion_conditioning import DiffusionConditioningOutput

RANDOM_BLOCK_STEPS = 50  # random numbers held at once: (50, samples, atoms, 3) fp32 of noise

Score = Callable[[Tensor, Tensor, ScorePlan], Tensor]  # (scaled noisy coords, times, plan) -> update
Step = Callable[[Tensor, Tensor, "SamplingRun"], Tensor]  # (coords, step index, run) -> coords


@dataclass
class SamplingRun:
    """What every step of one sampling run reads (in place, when replayed from a graph).

    S = records x samples rows, N atoms; `steps` sampling steps; random numbers for one block of steps.
    """

    t_hat: Tensor  # (steps,) fp32: the noise level each step denoises at
    noise_std: Tensor  # (steps,) fp32: standard deviation of the noise each step adds
    step_size: Tensor  # (steps,) fp32: step_scale * (next noise level - t_hat)
    quaternions: Tensor  # (RANDOM_BLOCK_STEPS, S, 4): random rotations of this block's steps
    translations: Tensor  # (RANDOM_BLOCK_STEPS, S, 1, 3)
    noise: Tensor  # (RANDOM_BLOCK_STEPS, S, N, 3)
    atom_mask: Tensor  # (S, N) fp32
    chunk_rows: dict[int, Tensor]  # chunk number -> its rows of the sample stack
    plans: dict[int, ScorePlan]  # chunk number -> the score model's plan (chunks of one size share it)


class FastSampler:
    """AtomDiffusion.sample with the fast score model (see the module docstring)."""

    def __init__(self, diffusion: AtomDiffusion, fast_score: FastScoreModel, score: Score) -> None:
        self.diffusion = diffusion
        self.fast_score = fast_score
        self.score = score  # fast_score under the score model's autocast

    @torch.no_grad()
    def sample(
        self,
        s_trunk: Tensor,
        s_inputs: Tensor,
        feats: dict[str, Tensor],
        conditioning: DiffusionConditioningOutput,
        recipe: InferenceRecipe,
        generator: torch.Generator,
        step: Step | None = None,
    ) -> Tensor:
        """AtomDiffusion.sample's result (B*M, N, 3) for the recipe's steps, samples and chunking;
        `step` runs one step (default: self.step, eagerly)."""
        step = self.step if step is None else step  # (a GraphedCall holding no graph is falsy)
        run, coords = self.start(s_trunk, s_inputs, feats, conditioning, recipe, generator)
        index = torch.zeros(1, dtype=torch.long, device=coords.device)
        for block_start in range(0, recipe.sampling_steps, RANDOM_BLOCK_STEPS):
            steps = min(RANDOM_BLOCK_STEPS, recipe.sampling_steps - block_start)
            self._draw(run, steps, generator)
            for number in range(block_start, block_start + steps):
                index.fill_(number)
                coords = step(coords, index, run)
        return coords.clone()  # a graph's output buffer is overwritten by its next replay

    def start(
        self,
        s_trunk: Tensor,
        s_inputs: Tensor,
        feats: dict[str, Tensor],
        conditioning: DiffusionConditioningOutput,
        recipe: InferenceRecipe,
        generator: torch.Generator,
    ) -> tuple[SamplingRun, Tensor]:
        """The run's schedule, plans and random-number buffers, and the initial noise (drawn first, as
        the reference draws it)."""
        diffusion = self.diffusion
        atom_mask = feats["atom_pad_mask"].float()
        batch, device = atom_mask.shape[0], atom_mask.device
        atom_mask = atom_mask.repeat_interleave(recipe.diffusion_samples, 0)
        shape = (*atom_mask.shape, 3)
        chunks = sample_chunks(batch, recipe.diffusion_samples, recipe.max_parallel_samples, device)
        # The score model's noise-independent token conditioning: once per record (samples share it).
        embedded = diffusion.score_model.single_conditioner.embed_trunk(s_trunk, s_inputs)
        plans_by_size: dict[int, ScorePlan] = {}
        for chunk in chunks:
            size = chunk.numel() // batch
            if size not in plans_by_size:
                plans_by_size[size] = self.fast_score.prepare(conditioning, feats, embedded, size)

        sigmas = diffusion.noise_schedule(recipe.sampling_steps, device)
        gammas = torch.where(sigmas > diffusion.gamma_min, diffusion.gamma_0, 0.0)
        # In float64, as the reference's Python floats, then float32 as its tensor arithmetic uses them.
        sigma_prev, sigma_next, gamma = sigmas[:-1].double(), sigmas[1:].double(), gammas[1:].double()
        t_hat = sigma_prev * (1 + gamma)
        noise_std = torch.sqrt(diffusion.noise_scale**2 * (t_hat**2 - sigma_prev**2))
        step_size = diffusion.step_scale * (sigma_next - t_hat)
        coords = sigmas[0] * torch.randn(shape, generator=generator, device=device)
        run = SamplingRun(
            t_hat=t_hat.float(),
            noise_std=noise_std.float(),
            step_size=step_size.float(),
            quaternions=torch.empty((RANDOM_BLOCK_STEPS, shape[0], 4), device=device),
            translations=torch.empty((RANDOM_BLOCK_STEPS, shape[0], 1, 3), device=device),
            noise=torch.empty((RANDOM_BLOCK_STEPS, *shape), device=device),
            atom_mask=atom_mask,
            chunk_rows=dict(enumerate(chunks)),
            plans={number: plans_by_size[chunk.numel() // batch] for number, chunk in enumerate(chunks)},
        )
        return run, coords

    @staticmethod
    def _draw(run: SamplingRun, steps: int, generator: torch.Generator) -> None:
        """The next `steps` steps' random numbers, in the reference's order, into the run's buffers."""
        for slot in range(steps):
            for buffer in (run.quaternions, run.translations, run.noise):
                buffer[slot].copy_(torch.randn(buffer.shape[1:], generator=generator, device=buffer.device))

    def step(self, coords: Tensor, step: Tensor, run: SamplingRun) -> Tensor:
        """One sampling step: coords (S, N, 3) at the step's noise level -> coords at the next one."""
        diffusion = self.diffusion
        slot = step % RANDOM_BLOCK_STEPS
        rotation = rotations_from_quaternions(run.quaternions.index_select(0, slot)[0])
        coords = coords - coords.mean(dim=-2, keepdim=True)  # over all atoms, padding too, as Boltz-2
        coords = torch.einsum("bmd,bds->bms", coords, rotation) + run.translations.index_select(0, slot)[0]
        t_hat = run.t_hat.index_select(0, step)
        noisy = coords + run.noise_std.index_select(0, step) * run.noise.index_select(0, slot)[0]
        denoised = torch.empty_like(noisy)
        for number, rows in run.chunk_rows.items():
            denoised[rows] = self._denoise(noisy[rows], t_hat, run.plans[number])
        if diffusion.alignment_reverse_diff:
            noisy = weighted_rigid_align(noisy, denoised, run.atom_mask, run.atom_mask, quaternion_rotation)
        return noisy + run.step_size.index_select(0, step) * ((noisy - denoised) / t_hat)

    def _denoise(self, noisy: Tensor, sigma: Tensor, plan: ScorePlan) -> Tensor:
        """AtomDiffusion.denoise at noise level sigma (1,), a device tensor."""
        diffusion = self.diffusion
        sigma_rows = sigma.expand(noisy.shape[0])
        padded_sigma = sigma_rows[:, None, None]
        update = self.score(diffusion.c_in(padded_sigma) * noisy, diffusion.c_noise(sigma_rows), plan)
        return diffusion.c_skip(padded_sigma) * noisy + diffusion.c_out(padded_sigma) * update
