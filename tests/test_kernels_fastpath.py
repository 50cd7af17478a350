"""foldmill.fastpath.runner on CPU: the fast runner computes Boltz2.predict's function; padding, precision copy,
and the benchmark's helpers. (CUDA graphs and bf16 kernels are covered on the GPU by test_kernels_gpu.py.)"""

from __future__ import annotations

import pytest
import torch
from oss_oracle import one_torch_thread  # noqa: F401 - fixture (tiny models run fastest on one thread)

from foldmill.bench._inputs import BenchInput, load_features, parse_inputs, save_features
from foldmill.bench.forward import coordinate_rmsd, geomean, speedups
from foldmill.errors import FoldmillError
from foldmill.fastpath.padding import OUTPUT_TOKEN_AXES, crop_token_outputs, pad_token_features
from foldmill.fastpath.prepare import FP32_SCORE_LAYERS, low_precision_score_model
from foldmill.fastpath.runner import FastBoltz2, FastPathOptions
from foldmill.model import Boltz2Config, InferenceRecipe, demo_model
from foldmill.model.diffusion import random_rotations

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
    """Kernels off: the same computation, bitwise. Kernels on (the restructured score model,
    foldmill.fastpath.score): the same function, equal up to fp32 rounding."""
    expected = model.predict(copy_of(features), RECIPE)
    reference = FastBoltz2(model, FastPathOptions(precision="fp32", pad_tokens_to=1, kernels=False))
    out = reference.predict(copy_of(features), RECIPE)
    assert out.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(out[name], expected[name], rtol=0, atol=0, msg=name)
    assert set(reference.stage_seconds) == {"trunk", "conditioning", "diffusion", "confidence"}
    fast = FastBoltz2(model, FastPathOptions(precision="fp32", pad_tokens_to=1))
    out = fast.predict(copy_of(features), RECIPE)
    for name in expected:  # a random model's coordinates reach ~3,000 A: relative to the largest
        assert max_relative_error(out[name], expected[name]) < 1e-5, name


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


def test_low_precision_network_is_a_bf16_copy_that_leaves_the_model_alone(model):
    from foldmill.fastpath.prepare import low_precision_network
    from foldmill.model.layers.layer_norm import LayerNorm
    from foldmill.model.layers.triangle_multiplication import TriangleMultiplicationOutgoing

    copy = low_precision_network(model, torch.bfloat16)
    assert copy.state_dict().keys() == model.state_dict().keys()  # same names, loadable both ways
    assert copy.structure_module.score_model is model.structure_module.score_model  # shared, not copied
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert not any(getattr(m, "in_compute_dtype", False) for m in model.modules())  # the model's norms as they were
    trimul = next(m for m in copy.modules() if isinstance(m, TriangleMultiplicationOutgoing))
    assert trimul.p_in.weight.dtype == torch.float32  # cuEquivariance reads these itself
    assert copy.pairformer_module.layers[0].attention.proj_q.weight.dtype == torch.bfloat16
    norm = copy.pairformer_module.layers[0].pre_norm_s
    assert isinstance(norm, LayerNorm) and norm.in_compute_dtype and norm.weight.dtype == torch.float32


def test_compute_dtype_layer_norm_matches_fp32_norm_rounded_once():
    from foldmill.model.layers.layer_norm import LayerNorm

    norm = LayerNorm(16)
    torch.nn.init.normal_(norm.weight)
    torch.nn.init.normal_(norm.bias)
    x = torch.randn(3, 5, 16) * 4 + 1
    expected = norm(x)
    norm.in_compute_dtype = True
    with torch.autocast("cpu", dtype=torch.bfloat16):
        from_fp32 = norm(x)
        from_bf16 = norm(x.bfloat16())
    assert from_fp32.dtype == from_bf16.dtype == torch.bfloat16
    assert torch.equal(from_fp32, expected.bfloat16())  # fp32 statistics, one rounding of the output
    torch.testing.assert_close(from_bf16.float(), norm(x.bfloat16().float()), rtol=1e-2, atol=2e-2)
    assert torch.equal(norm(x), expected)  # outside autocast: the plain fp32 LayerNorm
    # The op itself takes fp32 weights for a compute-dtype input too (cast to it), as the row-blocked
    # triangle multiplication passes them: the same result as weights cast beforehand.
    from foldmill.model.layers.layer_norm import layer_norm

    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast_inside = layer_norm(x.bfloat16(), norm.weight, norm.bias, norm.eps)
    assert torch.equal(cast_inside, from_bf16)


@pytest.mark.parametrize("residual", ["fp32", "bf16"])
def test_bf16_trunk_copy_stays_close_to_the_autocast_trunk(model, features, residual):
    """The bf16 weight copy computes what bf16 autocast over the fp32 model computes, within bf16 rounding,
    and keeps the trunk's s/z in the requested residual precision."""
    feats = copy_of(features)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = model.trunk(feats, recycling_steps=0)
    fast = FastBoltz2(model, FastPathOptions(trunk_residual=residual))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        ours = fast.network.trunk(feats, 0, fast.options.residual_dtype)
    dtype = torch.float32 if residual == "fp32" else torch.bfloat16
    assert ours.s.dtype == ours.z.dtype == dtype
    for name in ("s", "z"):
        assert max_relative_error(getattr(ours, name).float(), getattr(expected, name).float()) < 0.05, name


def test_bf16_residual_fast_path_runs_and_stays_close(model, features):
    expected = model.predict(copy_of(features), RECIPE)
    out = FastBoltz2(model, FastPathOptions(trunk_residual="bf16")).predict(copy_of(features), RECIPE)
    assert out["z"].dtype == torch.float32 and out["z"].shape == expected["z"].shape
    assert (out["plddt"] - expected["plddt"]).abs().max() < 0.05
    rmsd = coordinate_rmsd(out["sample_atom_coords"], expected["sample_atom_coords"], features["atom_pad_mask"][0])
    assert (rmsd / expected["sample_atom_coords"].std()).max() < 0.05


def test_shared_pair_bias_is_broadcast_and_equals_the_repeated_bias():
    from foldmill.model.layers.attention_pair_bias import AttentionPairBias, shared_by_samples

    torch.manual_seed(0)
    bias = torch.randn(1, 4, 6, 6)
    shared = shared_by_samples(bias, 3)
    assert shared.stride(0) == 0 and torch.equal(shared, bias.repeat_interleave(3, 0))  # a view, same values
    two_records = torch.randn(2, 4, 6, 6)
    assert torch.equal(shared_by_samples(two_records, 3), two_records.repeat_interleave(3, 0))
    layer = AttentionPairBias(c_s=16, num_heads=4, compute_pair_bias=False).eval()
    s = torch.randn(3, 6, 16)
    mask = torch.ones(3, 6)
    mask[:, -1] = 0
    pair_bias = torch.randn(1, 6, 6, 4)
    with torch.no_grad():
        out = layer(s, pair_bias, mask, k_in=s, multiplicity=3)
        repeated = layer(s, pair_bias.repeat_interleave(3, 0), mask, k_in=s, multiplicity=1)
    assert torch.equal(out, repeated)


def test_graphed_pairformer_runs_the_stack_eagerly_off_cuda(model, features):
    from foldmill.fastpath.prepare import GraphedPairformer

    default = FastBoltz2(model).network.confidence_module.pairformer_stack
    assert not isinstance(default, GraphedPairformer)  # confidence graphs are off by default
    fast = FastBoltz2(model, FastPathOptions(max_confidence_graph_tokens=512))
    confidence_stack = fast.network.confidence_module.pairformer_stack
    assert isinstance(fast.network.pairformer_module, GraphedPairformer)
    assert isinstance(confidence_stack, GraphedPairformer)
    assert not isinstance(model.pairformer_module, GraphedPairformer)  # the caller's model is untouched
    assert not isinstance(model.confidence_module.pairformer_stack, GraphedPairformer)
    fast.predict(copy_of(features), RECIPE)
    # CPU: no graphs, no capture attempts
    assert fast.network.pairformer_module.graphs.captures == 0 and confidence_stack.graphs.captures == 0


def test_outer_product_mean_by_token_rows_equals_unchunked():
    from foldmill.model.layers.outer_product_mean import OuterProductMean
    from foldmill.model.msa_module import MSAChunking

    torch.manual_seed(1)
    layer = OuterProductMean(c_in=8, c_hidden=4, c_out=6).eval()
    torch.nn.init.normal_(layer.proj_o.weight)
    m = torch.randn(1, 5, 11, 8)
    mask = (torch.rand(1, 5, 11) > 0.2).float()
    with torch.no_grad():
        expected = layer(m, mask)
        for rows in (1, 4, 11, 32):
            torch.testing.assert_close(layer(m, mask, token_rows=rows), expected, rtol=1e-6, atol=1e-6)
    for tokens in (500, 1000, 6000):
        rows = MSAChunking.for_tokens(tokens).outer_product_rows
        assert rows is not None and tokens * 32 * 32 * 4 * rows <= 256 << 20
    assert MSAChunking.for_tokens(384).outer_product_rows is None  # unchunked up to Boltz-2's large-input size


def test_pair_transition_by_token_rows_equals_unchunked(monkeypatch):
    from foldmill.model.layers import pairformer

    assert pairformer.pair_transition_rows(1000, 128) is None  # Boltz-2's computation up to 1,024 tokens
    assert 6000 * 4 * 128 * 4 * pairformer.pair_transition_rows(6000, 128) <= 1 << 30
    torch.manual_seed(2)
    layer = pairformer.PairformerNoSeqLayer(token_z=16, pairwise_head_width=4, pairwise_num_heads=2).eval()
    z = torch.randn(1, 9, 9, 16)
    pair_mask = torch.ones(1, 9, 9)
    with torch.no_grad():
        expected = layer(z, pair_mask)
        monkeypatch.setattr(pairformer, "ROW_CHUNKED_TRANSITION_TOKENS", 4)
        monkeypatch.setattr(pairformer, "PAIR_TRANSITION_BLOCK_BYTES", 2 * 9 * 4 * 16 * 4)  # 2 rows per block
        assert pairformer.pair_transition_rows(9, 16) == 2
        chunked = layer(z, pair_mask)
    torch.testing.assert_close(chunked, expected, rtol=1e-6, atol=1e-6)


def test_bench_counts_a_modules_bytes_on_a_device_given_without_index():
    """device_bytes must match parameters on cuda:0 when asked for "cuda" (a contender's own weights
    count towards its peak); shared tensors once, other devices not at all."""
    from foldmill.bench.forward import device_bytes

    module = torch.nn.Linear(4, 3)
    module.extra = torch.nn.Parameter(module.weight)  # shared: counted once
    assert device_bytes(module, torch.device("cpu")) == (12 + 3) * 4
    assert device_bytes(module, torch.device("meta")) == 0
    if torch.cuda.is_available():
        module.cuda()
        assert device_bytes(module, torch.device("cuda")) == device_bytes(module, torch.device("cuda", 0)) == 60


def test_bench_contenders_share_a_checkpoints_weights(tmp_path):
    """`foldmill bench forward --checkpoint`: foldmill's model and OSS's hold the file's weights and architecture."""
    from foldmill.bench.forward import _Models

    saved = demo_model(Boltz2Config.small(), seed=4).state_dict()
    path = tmp_path / "weights.pt"
    torch.save(saved, path)
    models = _Models(Boltz2Config(), torch.device("cpu"), seed=0, checkpoint=str(path))
    assert models.config.pairformer_blocks == Boltz2Config.small().pairformer_blocks  # read off the weights
    ours = models.foldmill_model(with_oss_weights=True).state_dict()
    assert all(torch.equal(ours[name], value) for name, value in saved.items())
    pytest.importorskip("boltz")
    oss = models.oss_model().state_dict()
    assert all(torch.equal(oss[name], value) for name, value in saved.items())
