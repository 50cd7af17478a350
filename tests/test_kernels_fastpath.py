"""foldmill.model.fastpath on CPU: the fast runner computes Boltz2.predict's function; padding, precision copy,
and the benchmark's helpers. (CUDA graphs and bf16 kernels are covered on the GPU by test_kernels_gpu.py.)"""

from __future__ import annotations

import pytest
import torch
from oss_oracle import one_torch_thread  # noqa: F401 - fixture (tiny models run fastest on one thread)

from foldmill.bench._inputs import BenchInput, load_features, parse_inputs, save_features
from foldmill.bench.forward import coordinate_rmsd, geomean, speedups
from foldmill.errors import FoldmillError
from foldmill.kernels.padding import OUTPUT_TOKEN_AXES, crop_token_outputs, pad_token_features
from foldmill.model import Boltz2Config, InferenceRecipe, demo_model
from foldmill.model.diffusion import random_rotations
from foldmill.model.fastpath import (
    FP32_SCORE_LAYERS,
    FastBoltz2,
    FastPathOptions,
    layer_major,
    low_precision_score_model,
)

RECIPE = InferenceRecipe(recycling_steps=1, sampling_steps=3, diffusion_samples=3, max_parallel_samples=2, seed=5)


@pytest.fixture(scope="module")
def model(one_torch_thread):  # noqa: F811 - the imported fixture, requested by name
    return demo_model(Boltz2Config.small(), seed=4)


@pytest.fixture(scope="module")
def features(tmp_path_factory):
    """A 2-chain protein of 13 tokens (not a multiple of 8) with a synthetic MSA, via foldmill.features."""
    from foldmill.bench._inputs import featurize_input

    feats = featurize_input(BenchInput((6, 7), msa_depth=4))
    path = tmp_path_factory.mktemp("bench") / "features.npz"
    save_features(path, feats)
    loaded = load_features(path)
    assert all(torch.equal(loaded[name], feats[name]) and loaded[name].dtype == feats[name].dtype for name in feats)
    return loaded


def copy_of(feats):
    return {name: value.clone() for name, value in feats.items()}


def max_relative_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return float((ours.double() - reference.double()).abs().max() / reference.double().abs().max().clamp(min=1e-12))


def test_fp32_fast_path_equals_predict(model, features):
    expected = model.predict(copy_of(features), RECIPE)
    fast = FastBoltz2(model, FastPathOptions(precision="fp32", pad_tokens_to=1))
    out = fast.predict(copy_of(features), RECIPE)
    assert out.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(out[name], expected[name], rtol=0, atol=0, msg=name)
    assert set(fast.stage_seconds) == {"trunk", "conditioning", "diffusion", "confidence"}


def test_token_padding_keeps_results(model, features):
    expected = model.predict(copy_of(features), RECIPE)
    padded, num_tokens = pad_token_features(features, 8)
    assert num_tokens == 13 and padded["token_pad_mask"].shape[1] == 16 and padded["msa"].shape[2] == 16
    assert padded["atom_to_token"].shape[2] == 16 and padded["ref_pos"].shape == features["ref_pos"].shape
    out = FastBoltz2(model, FastPathOptions(precision="fp32", pad_tokens_to=8)).predict(copy_of(features), RECIPE)
    for name, value in expected.items():
        assert out[name].shape == value.shape, name
        assert max_relative_error(out[name], value) <= 1e-4, name  # summation order only


def test_crop_restores_token_axes():
    out = {name: torch.zeros((2,) + (16,) * len(axes) + (3,)) for name, axes in OUTPUT_TOKEN_AXES.items()}
    out["ptm"] = torch.zeros(2)
    cropped = crop_token_outputs(out, 13)
    assert (
        cropped["z"].shape == (2, 13, 13, 3) and cropped["plddt"].shape == (2, 13, 3) and cropped["ptm"].shape == (2,)
    )


def test_bf16_fast_path_runs_and_stays_close(model, features):
    expected = model.predict(copy_of(features), RECIPE)
    out = FastBoltz2(model, FastPathOptions(precision="bf16")).predict(copy_of(features), RECIPE)
    assert all(value.dtype != torch.bfloat16 for value in out.values())
    assert (out["plddt"] - expected["plddt"]).abs().max() < 0.05
    rmsd = coordinate_rmsd(out["sample_atom_coords"], expected["sample_atom_coords"], features["atom_pad_mask"][0])
    scale = expected["sample_atom_coords"].std()
    assert (rmsd / scale).max() < 0.05  # random weights: compare relative to the structure's spread


def test_low_precision_score_model_keeps_coordinate_layers_fp32(model):
    original = model.structure_module.score_model
    copy = low_precision_score_model(original, torch.bfloat16)
    assert next(original.parameters()).dtype == torch.float32  # the model itself is untouched
    fp32_names = tuple(name + "." for name in FP32_SCORE_LAYERS)
    for name, module in copy.named_modules():
        if isinstance(module, torch.nn.Linear):
            expected = torch.float32 if name.startswith(fp32_names) else torch.bfloat16
            assert module.weight.dtype == expected, name
        if isinstance(module, torch.nn.LayerNorm) and module.weight is not None and not name.startswith(fp32_names):
            assert module.weight.dtype == torch.float32, name  # norms keep fp32 parameters


def test_layer_major_bias_keeps_values_and_makes_layer_slices_contiguous():
    bias = torch.randn(2, 5, 7, 4 * 3)
    stored = layer_major(bias, depth=4)
    assert torch.equal(stored, bias) and stored.clone().stride() == stored.stride()  # graph copies keep it
    layer = stored.view(2, 5, 7, 4, 3)[:, :, :, 2].movedim(-1, 1)  # what the token transformer reads
    assert all(layer[b].is_contiguous() for b in range(2))


def test_options_are_validated():
    with pytest.raises(ValueError, match="precision"):
        FastPathOptions(precision="int8")
    with pytest.raises(ValueError, match="precision"):
        FastPathOptions(score_precision="fp8")
    assert FastPathOptions(precision="fp32", score_precision="bf16").score_dtype == torch.bfloat16


def test_bench_input_specs():
    items = parse_inputs("150, 2x197@256,300+120")
    assert [(i.name, i.tokens, i.kind, i.msa_depth) for i in items] == [
        ("150", 150, "monomer", 0),
        ("2x197@256", 394, "2-mer", 256),
        ("300+120", 420, "2-mer", 0),
    ]
    with pytest.raises(FoldmillError, match="bad benchmark input"):
        parse_inputs("2x")


def test_rmsd_is_rigid_motion_invariant():
    generator = torch.Generator().manual_seed(0)
    coords = torch.randn(2, 40, 3, generator=generator) * 10
    moved = torch.einsum("snd,sed->sne", coords, random_rotations(2, generator, torch.device("cpu"))) + 3.0
    mask = torch.ones(40)
    assert coordinate_rmsd(moved, coords, mask).max() < 1e-4
    noisy = coords + 0.5 * torch.randn(coords.shape, generator=generator)
    assert 0.3 < coordinate_rmsd(noisy, coords, mask).min() < 1.0


def test_speedup_summary():
    rows = [
        {"input": "a", "contender": "oss-eager", "seconds": 10.0},
        {"input": "a", "contender": "foldmill", "seconds": 2.0},
        {"input": "b", "contender": "oss-eager", "seconds": 8.0},
        {"input": "b", "contender": "foldmill", "seconds": 4.0},
        {"input": "c", "contender": "oss-eager", "status": "OOM"},
    ]
    assert speedups(rows, "oss-eager") == {"a": 5.0, "b": 2.0}
    assert geomean([5.0, 2.0]) == pytest.approx(10**0.5, abs=1e-3)
