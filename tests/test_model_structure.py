"""The structure side: atom windows, rigid geometry, noise schedule, sample chunking, score model.

Component-level checks against OSS Boltz-2's own functions (oracle), properties that hold
whatever the reference says (a known rigid motion is recovered, rotations are proper), and
the sampler's seed and max-parallel behaviour.
"""

from __future__ import annotations

import math

import pytest
import torch

import oss_oracle
from oss_oracle import one_torch_thread, oracle_features  # noqa: F401 - fixtures
from foldmill.model import Boltz2, Boltz2Config, InferenceRecipe, demo_model
from foldmill.model.atom_attention import AtomWindows
from foldmill.model.diffusion import random_rotations, sample_chunks, weighted_rigid_align

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.oracle
@pytest.mark.parametrize("num_atoms", [32, 96, 160])
def test_key_windows_match_oss_indexing(num_atoms):
    from boltz.model.modules.encodersv2 import get_indexing_matrix, single_to_keys

    windows = AtomWindows(32, 128)
    values = torch.randn(2, num_atoms, 5)
    matrix = get_indexing_matrix(num_atoms // 32, 32, 128, values.device)
    expected = single_to_keys(values, matrix, 32, 128)
    assert torch.equal(windows.key_window(values), expected)


def test_key_windows_are_centred_and_zero_padded():
    windows = AtomWindows(32, 128)
    positions = torch.arange(1, 97, dtype=torch.float32).view(1, 96)  # atom i holds i + 1
    keys = windows.key_window(positions)  # (1, 3, 128)
    # Window 1 (atoms 32..63) sees atoms 32 - 48 .. 63 + 48, i.e. -16 .. 111: zeros outside 0..95.
    expected = torch.arange(-16, 112, dtype=torch.float32) + 1
    expected[(expected < 1) | (expected > 96)] = 0
    assert torch.equal(keys[0, 1], expected)


def rigid_motion(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    rotation = random_rotations(1, generator, torch.device("cpu"))
    translation = 10 * torch.randn(1, 1, 3, generator=generator)
    return rotation, translation


def test_rigid_align_recovers_a_rigid_motion_and_ignores_masked_atoms():
    coords = 5 * torch.randn(1, 40, 3)
    rotation, translation = rigid_motion(3)
    target = coords @ rotation + translation
    mask = torch.ones(1, 40)
    mask[0, 30:] = 0
    target[0, 30:] += 100.0  # masked atoms may be anywhere
    aligned = weighted_rigid_align(coords, target, mask, mask)
    assert torch.allclose(aligned[0, :30], target[0, :30], atol=1e-4)


def test_random_rotations_are_proper():
    rotations = random_rotations(64, torch.Generator().manual_seed(0), torch.device("cpu"))
    identity = torch.eye(3).expand(64, 3, 3)
    assert torch.allclose(rotations @ rotations.transpose(1, 2), identity, atol=1e-5)
    assert torch.allclose(torch.det(rotations), torch.ones(64), atol=1e-5)


@pytest.mark.oracle
def test_rotations_alignment_and_chunks_match_oss():
    from boltz.model.loss.diffusionv2 import weighted_rigid_align as oss_align
    from boltz.model.modules.diffusionv2 import _get_sample_id_chunks
    from boltz.model.modules.utils import random_rotations as oss_rotations

    torch.manual_seed(5)
    expected = oss_rotations(8, dtype=torch.float32, device=torch.device("cpu"))
    assert torch.equal(random_rotations(8, torch.Generator().manual_seed(5), torch.device("cpu")), expected)

    coords, target = 20 * torch.randn(3, 64, 3), 20 * torch.randn(3, 64, 3)
    mask = (torch.rand(3, 64) > 0.2).float()
    assert torch.equal(weighted_rigid_align(coords, target, mask, mask), oss_align(coords, target, mask, mask))

    for batch, samples, cap in [(1, 5, 2), (2, 5, 2), (3, 4, 4), (2, 3, 1)]:
        ours = sample_chunks(batch, samples, cap, torch.device("cpu"))
        theirs = _get_sample_id_chunks(batch, samples, cap, torch.device("cpu"))
        assert [c.tolist() for c in ours] == [c.tolist() for c in theirs]
        assert sorted(torch.cat(ours).tolist()) == list(range(batch * samples))
        assert all(chunk.numel() <= batch * cap for chunk in ours)


@pytest.mark.oracle
def test_noise_schedule_matches_oss():
    oss = oss_oracle.oss_model(Boltz2Config.small())
    ours = Boltz2(Boltz2Config.small())
    for steps in (2, 5, 200):
        expected = oss.structure_module.sample_schedule(steps)
        schedule = ours.structure_module.noise_schedule(steps, torch.device("cpu"))
        assert torch.equal(schedule, expected)
        assert schedule[0] == pytest.approx(160 * 16) and schedule[-1] == 0
        assert schedule[-2] == pytest.approx(1e-4 * 16, rel=1e-4)


@pytest.mark.oracle
def test_one_denoising_step_matches_oss(oracle_features):
    """The preconditioned score model on given noisy coordinates, bitwise."""
    config = Boltz2Config.small()
    oss = oss_oracle.oss_model(config, seed=2)
    ours = Boltz2(config)
    ours.load_state_dict(oss.state_dict(), strict=True)
    feats = oracle_features("protein_ligand")
    with torch.no_grad():
        trunk = ours.trunk(feats, recycling_steps=0)
        conditioning = ours.diffusion_conditioning(trunk.s, trunk.z, trunk.relative_position_encoding, feats)
        q, c, to_keys, enc_bias, dec_bias, token_bias = oss.diffusion_conditioning(
            trunk.s, trunk.z, trunk.relative_position_encoding, feats
        )
        for name, theirs in [("q", q), ("c", c), ("atom_enc_bias", enc_bias), ("atom_dec_bias", dec_bias),
                             ("token_trans_bias", token_bias)]:
            assert torch.equal(getattr(conditioning, name), theirs), name
        noisy = 30 * torch.randn(3, feats["atom_pad_mask"].shape[1], 3, generator=torch.Generator().manual_seed(1))
        embedded = ours.structure_module.score_model.single_conditioner.embed_trunk(
            trunk.s.repeat_interleave(3, 0), trunk.s_inputs.repeat_interleave(3, 0)
        )
        denoised = ours.structure_module.denoise(noisy, 37.5, embedded, feats, conditioning, multiplicity=3)
        expected = oss.structure_module.preconditioned_network_forward(
            noisy,
            37.5,
            network_condition_kwargs=dict(
                s_inputs=trunk.s_inputs,
                s_trunk=trunk.s,
                feats=feats,
                multiplicity=3,
                diffusion_conditioning=dict(
                    q=q, c=c, to_keys=to_keys,
                    atom_enc_bias=enc_bias, atom_dec_bias=dec_bias, token_trans_bias=token_bias,
                ),
            ),
        )
    assert torch.equal(denoised, expected)


def test_sampler_seed_and_parallel_cap(oracle_features):
    """Same seed, same structures whatever max_parallel_samples; another seed, other structures."""
    model = demo_model(Boltz2Config.small(), seed=4)
    feats = oracle_features("cyclic_peptide")

    def sample(max_parallel: int, seed: int) -> torch.Tensor:
        recipe = InferenceRecipe(
            recycling_steps=0, sampling_steps=3, diffusion_samples=3, max_parallel_samples=max_parallel, seed=seed
        )
        return model.predict(dict(feats), recipe)["sample_atom_coords"]

    one_at_a_time = sample(1, seed=9)
    all_at_once = sample(3, seed=9)
    scale = all_at_once.abs().max()
    assert one_at_a_time.shape == (3, feats["atom_pad_mask"].shape[1], 3)
    assert torch.isfinite(one_at_a_time).all()
    assert (one_at_a_time - all_at_once).abs().max() <= 1e-5 * scale
    assert torch.equal(sample(2, seed=9), sample(2, seed=9))
    assert (sample(3, seed=10) - all_at_once).abs().max() > 1e-2 * scale
    # The three samples differ from each other (independent noise).
    assert not torch.allclose(all_at_once[0], all_at_once[1])


def test_recipe_rejects_unusable_settings():
    from foldmill.errors import FoldmillError

    for bad in ({"sampling_steps": 1}, {"diffusion_samples": 0}, {"max_parallel_samples": 0}, {"recycling_steps": -1}):
        with pytest.raises(FoldmillError):
            InferenceRecipe(**bad)


def test_demo_model_is_labelled_and_reproducible():
    first, second = demo_model(seed=3), demo_model(seed=3)
    assert first.provenance["model"] == "demo"
    for (name, a), (_, b) in zip(first.state_dict().items(), second.state_dict().items()):
        assert torch.equal(a, b), name
    other = demo_model(seed=4)
    assert not torch.equal(first.s_init.weight, other.s_init.weight)
    assert math.isclose(float(first.s_init.weight.detach().std()), 1 / math.sqrt(first.config.token_s), rel_tol=0.2)


@pytest.mark.gpu
def test_demo_model_made_on_the_gpu_is_reproducible_there():
    first, second = demo_model(seed=3, device="cuda"), demo_model(seed=3, device="cuda")
    on_host = demo_model(seed=3)
    assert first.provenance["weights"] == "random, seed 3, drawn on cuda"
    for (name, a), b, c in zip(first.state_dict().items(), second.state_dict().values(), on_host.state_dict().values()):
        assert a.is_cuda and torch.equal(a, b) and a.shape == c.shape, name
    assert math.isclose(float(first.s_init.weight.detach().std()), 1 / math.sqrt(first.config.token_s), rel_tol=0.2)
