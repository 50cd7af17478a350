"""The fast path's sampler (foldmill.fastpath.sampler): its sync-free rotation is the SVD's, and
drawing random numbers ahead in blocks gives the same samples as drawing them step by step."""

from __future__ import annotations

import pytest
import torch
from oss_oracle import one_torch_thread  # noqa: F401 - fixture (tiny models run fastest on one thread)

from foldmill.bench._inputs import BenchInput, featurize_input
from foldmill.fastpath import sampler as fast_sampler
from foldmill.fastpath.runner import FastBoltz2, FastPathOptions
from foldmill.model import Boltz2Config, InferenceRecipe, demo_model
from foldmill.model.diffusion import kabsch_rotation, quaternion_rotation, random_rotations, weighted_rigid_align


def kabsch_float64(covariance: torch.Tensor) -> torch.Tensor:
    u, _, v_h = torch.linalg.svd(covariance.double())
    rotation = u @ v_h
    fix = torch.eye(3, dtype=torch.float64).repeat(*covariance.shape[:-2], 1, 1)
    fix[..., -1, -1] = torch.det(rotation)
    return u @ fix @ v_h


def test_quaternion_rotation_is_the_kabsch_rotation():
    generator = torch.Generator().manual_seed(0)
    for scale in (1e-3, 1.0, 1e3):
        covariance = scale * torch.randn(64, 3, 3, generator=generator, dtype=torch.float64)
        assert (torch.det(covariance) < 0).any() and (torch.det(covariance) > 0).any()  # reflections too
        rotation = quaternion_rotation(covariance)
        assert torch.allclose(rotation, kabsch_float64(covariance), atol=1e-10)
        assert torch.allclose(torch.det(rotation), torch.ones(64, dtype=torch.float64))
    assert torch.equal(quaternion_rotation(torch.zeros(2, 3, 3)), torch.eye(3).expand(2, 3, 3))  # defined at 0


def test_rigid_alignment_recovers_a_rigid_motion_either_way():
    generator = torch.Generator().manual_seed(1)
    coords = 20 * torch.randn(3, 40, 3, generator=generator)
    rotation = random_rotations(3, generator, torch.device("cpu"))
    target = torch.einsum("bni,bji->bnj", coords, rotation) + torch.randn(3, 1, 3, generator=generator)
    weights = torch.rand(3, 40, generator=generator)
    mask = (torch.rand(3, 40, generator=generator) > 0.1).float()
    for rotation_of in (kabsch_rotation, quaternion_rotation):
        aligned = weighted_rigid_align(coords, target, weights, mask, rotation_of)
        assert (aligned - target).abs().max() < 1e-3, rotation_of.__name__


@pytest.fixture(scope="module")
def model(one_torch_thread):  # noqa: F811 - the imported fixture, requested by name
    return demo_model(Boltz2Config.small(), seed=2)


def test_random_numbers_drawn_in_blocks_give_the_same_samples(model, monkeypatch):
    pytest.importorskip("biotite")  # the featurizer's CCD
    feats = featurize_input(BenchInput((8, 11)))
    recipe = InferenceRecipe(recycling_steps=0, sampling_steps=5, diffusion_samples=2, max_parallel_samples=2, seed=9)
    fast = FastBoltz2(model, FastPathOptions(precision="fp32"))
    whole = fast.predict(dict(feats), recipe)["sample_atom_coords"]
    monkeypatch.setattr(fast_sampler, "RANDOM_BLOCK_STEPS", 2)  # blocks of 2, 2 and 1 steps
    blocks = fast.predict(dict(feats), recipe)["sample_atom_coords"]
    assert torch.equal(blocks, whole)
