"""The restructured score model (foldmill.fastpath.score) computes DiffusionModule.forward:
fp32 on the CPU against the module (padding tokens, two records, atoms not laid out by token),
its routed ops against their definitions, their Triton kernels under the interpreter (skipped
without triton) and on the GPU, and the bf16 model on the GPU at the published architecture."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from kernel_testing import HAS_TRITON, relative_error, run_interpreted
from oss_oracle import one_torch_thread  # noqa: F401 - fixture (tiny models run fastest on one thread)
from torch.nn import functional as F

from foldmill.bench._inputs import BenchInput, featurize_input, load_features
from foldmill.fastpath.padding import pad_token_features
from foldmill.fastpath.score import FastScoreModel, token_mean
from foldmill.features.featurize import stack_featurized
from foldmill.model import Boltz2Config, demo_model
from foldmill.model.atom_attention import mean_atoms_per_token
from foldmill.model.diffusion_transformer import AdaLN, SwiGLU
from foldmill.model.layers import modulation


@pytest.fixture(scope="module")
def model(one_torch_thread):  # noqa: F811 - the imported fixture, requested by name
    return demo_model(Boltz2Config.small(), seed=7)


@pytest.fixture(scope="module")
def dimer():
    pytest.importorskip("biotite")  # the featurizer's CCD
    return featurize_input(BenchInput((9, 12)))


@pytest.fixture(scope="module")
def monomer():
    pytest.importorskip("biotite")
    return featurize_input(BenchInput((14,)))


def score_both_ways(model, feats, samples, seed=0):
    """(restructured, module) score-model outputs for the same noisy coordinates, fp32."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        trunk = model.trunk(feats, recycling_steps=0)
        conditioning = model.diffusion_conditioning(trunk.s, trunk.z, trunk.relative_position_encoding, feats)
        score_model = model.structure_module.score_model
        batch, atoms = feats["atom_pad_mask"].shape
        noisy = 10 * torch.randn(batch * samples, atoms, 3, generator=generator)
        times = torch.full((batch * samples,), 0.4)
        per_record = score_model.single_conditioner.embed_trunk(trunk.s, trunk.s_inputs)
        embedded = per_record.repeat_interleave(samples, 0)
        expected = score_model(noisy, times, embedded, feats, conditioning, multiplicity=samples)
        fast = FastScoreModel(score_model)
        plan = fast.prepare(conditioning, feats, per_record, samples)
        return fast(noisy, times, plan), expected, plan


def test_fp32_equals_the_module(model, dimer):
    out, expected, plan = score_both_ways(model, dimer, samples=3)
    assert plan.max_atoms > 0  # the featurizer lays atoms out token by token: the segment mean runs
    assert relative_error(out, expected) < 1e-6


def test_fp32_equals_the_module_with_padding_tokens(model, dimer):
    padded, _ = pad_token_features(dict(dimer), 8)
    assert not bool(padded["token_pad_mask"].all())
    out, expected, _ = score_both_ways(model, padded, samples=2)
    assert relative_error(out, expected) < 1e-6


def test_fp32_equals_the_module_for_two_records(model, dimer, monomer):
    batch = stack_featurized([SimpleNamespace(features=dimer), SimpleNamespace(features=monomer)])
    out, expected, _ = score_both_ways(model, batch, samples=2)
    assert out.shape[0] == 4 and relative_error(out, expected) < 1e-6


def test_atoms_not_laid_out_by_token_take_the_dense_mean(model, dimer):
    feats = dict(dimer)
    order = torch.arange(feats["atom_to_token"].shape[1])
    order[[0, 20]] = order[[20, 0]]  # two atoms of different tokens swapped
    feats["atom_to_token"] = feats["atom_to_token"][:, order]
    out, expected, plan = score_both_ways(model, feats, samples=2)
    assert plan.max_atoms == 0 and relative_error(out, expected) < 1e-6


def test_adaptive_layer_norm_is_adaln_broadcast_over_samples():
    torch.manual_seed(0)
    adaln = AdaLN(16, 12).eval()
    a, s = torch.randn(2 * 3, 5, 16), torch.randn(2, 5, 12)  # 2 records x 3 samples
    with torch.no_grad():
        expected = adaln(a, s.repeat_interleave(3, 0))
        s_normed = adaln.s_norm(s)
        scale, shift = torch.sigmoid(adaln.s_scale(s_normed)), adaln.s_bias(s_normed)
    out = modulation.adaptive_layer_norm(a, scale, shift, samples=3, eps=adaln.a_norm.eps)
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)


def test_swiglu_product_is_the_transition_product():
    h = torch.randn(4, 7, 3 * 8)
    expected = SwiGLU()(h[..., :16]) * h[..., 16:]
    torch.testing.assert_close(modulation.swiglu_product(h), expected, rtol=1e-6, atol=1e-6)


def segments(seed: int, batch: int = 2, tokens: int = 9):
    """Random contiguous atom segments (empty trailing tokens, padding atoms): x, starts, inverse counts,
    most atoms, and the one-hot they stand for."""
    generator = torch.Generator().manual_seed(seed)
    counts = torch.randint(1, 5, (batch, tokens), generator=generator)
    counts[:, -2:] = 0
    ends = counts.cumsum(1)
    atoms = int(ends[:, -1].max()) + 3
    one_hot = torch.zeros(batch, atoms, tokens)
    for record in range(batch):
        for token in range(tokens):
            one_hot[record, ends[record, token] - counts[record, token] : ends[record, token], token] = 1
    starts = F.pad(ends, (1, 0)).int()
    return starts, 1 / (counts.float() + 1e-6), int(counts.max()), one_hot, atoms


def test_token_mean_is_the_dense_mean():
    starts, inverse, most, one_hot, atoms = segments(1)
    samples = 3
    x = torch.randn(2 * samples, atoms, 6)
    expected = mean_atoms_per_token(x, one_hot.repeat_interleave(samples, 0))
    torch.testing.assert_close(token_mean(x, starts, inverse, samples, most), expected, rtol=1e-5, atol=1e-6)


def kernel_cases() -> list[dict]:
    generator = torch.Generator().manual_seed(3)
    cases = []
    for name, records, samples, length, width, dtype in (
        ("token_bf16", 1, 3, 10, 48, torch.bfloat16),
        ("atoms_two_records_fp32", 2, 2, 7, 24, torch.float32),
    ):
        a = torch.randn(records * samples, length, width, generator=generator) * 2 + 1
        terms = torch.randn(records, length, 5, width, generator=generator)  # strided views, as the plan's
        cases.append(
            {
                "name": name,
                "samples": samples,
                "a": a,
                "scale": terms[:, :, 1].to(dtype),
                "shift": terms[:, :, 3].to(dtype),
                "gate": terms[:, :, 4].to(dtype),
                "update": torch.randn(records * samples, length, width, generator=generator).to(dtype),
                "h": torch.randn(records * samples, length, 3 * width, generator=generator).to(dtype),
            }
        )
    starts, inverse, most, _, atoms = segments(4)
    cases.append(
        {"name": "token_mean", "samples": 2, "x": torch.randn(4, atoms, 40, generator=generator).bfloat16(),
         "starts": starts, "inverse": inverse, "most": most}  # fmt: skip
    )
    return cases


def check_kernel_outputs(cases: list[dict], outputs: dict) -> None:
    for case in cases:
        name = case["name"]
        if name == "token_mean":
            expected = token_mean(case["x"], case["starts"], case["inverse"], case["samples"], case["most"])
            assert torch.equal(outputs[name], expected)  # the same sums in the same order
            continue
        tolerance = 1e-5 if case["shift"].dtype == torch.float32 else 1e-2
        modulated = modulation.adaptive_layer_norm(case["a"], case["scale"], case["shift"], case["samples"], 1e-5)
        assert relative_error(outputs[name + "/adaln"], modulated) < tolerance, name
        assert outputs[name + "/adaln"].dtype == case["shift"].dtype
        a = case["a"].clone()
        modulated = modulation.residual_adaptive_layer_norm(
            a, case["gate"], case["update"], case["scale"], case["shift"], case["samples"], 1e-5
        )
        assert relative_error(outputs[name + "/residual_a"], a) < 1e-6, name  # a += gate * update, in fp32
        assert relative_error(outputs[name + "/residual_adaln"], modulated) < tolerance, name
        assert relative_error(outputs[name + "/swiglu"], modulation.swiglu_product(case["h"])) < tolerance, name


def run_kernels(cases: list[dict], device: str) -> dict:
    from foldmill.kernels.adaptive_layer_norm import triton_kernel as kernel
    from foldmill.kernels.swiglu_product import triton_kernel as swiglu_kernel
    from foldmill.kernels.token_mean import triton_kernel as token_mean_kernel

    outputs = {}
    for case in cases:
        on = {key: value.to(device) if isinstance(value, torch.Tensor) else value for key, value in case.items()}
        if case["name"] == "token_mean":
            outputs["token_mean"] = token_mean_kernel.token_mean(on["x"], on["starts"], on["inverse"], on["samples"], on["most"])
        else:
            outputs[case["name"] + "/adaln"] = kernel.adaptive_layer_norm(
                on["a"], on["scale"], on["shift"], on["samples"], 1e-5
            )
            outputs[case["name"] + "/swiglu"] = swiglu_kernel.swiglu_product(on["h"])
            a = on["a"].clone()
            outputs[case["name"] + "/residual_adaln"] = kernel.adaptive_layer_norm(
                a, on["scale"], on["shift"], on["samples"], 1e-5, gate=on["gate"], update=on["update"]
            )
            outputs[case["name"] + "/residual_a"] = a
    return {key: value.cpu() for key, value in outputs.items()}


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
def test_kernels_under_the_triton_interpreter(tmp_path):
    cases = kernel_cases()
    check_kernel_outputs(cases, run_interpreted(__file__, cases, tmp_path, timeout=300))


@pytest.mark.gpu
def test_kernels_on_the_gpu():
    cases = kernel_cases()
    check_kernel_outputs(cases, run_kernels(cases, "cuda"))


@pytest.mark.gpu
def test_bf16_restructured_score_model_on_the_gpu():
    """Published architecture, ~300 tokens with padding: the restructured bf16 score model is as close to
    the fp32 module as the bf16 module is (foldmill bench score measures the same at other sizes)."""
    from foldmill.bench.score import _trunk_like
    from foldmill.fastpath.cuda_graphs import GraphedCall
    from foldmill.fastpath.runner import FastBoltz2, FastPathOptions
    from foldmill.kernels import kernel_policy
    from foldmill.model import Boltz2
    from foldmill.model.demo import randomize_weights

    device = torch.device("cuda")
    with torch.device(device):
        model = Boltz2(Boltz2Config())
    randomize_weights(model, 0)
    model.eval()
    # Featurized here with foldmill.bench._inputs (BenchInput((130, 167))): the GPU machine has no CCD.
    saved = load_features(Path(__file__).parent / "data" / "features_130+167.npz")
    feats, _ = pad_token_features({name: value.to(device) for name, value in saved.items()}, 8)
    fast, module = FastBoltz2(model, FastPathOptions()), FastBoltz2(model, FastPathOptions(kernels=False))
    generator = torch.Generator(device=device).manual_seed(1)
    trunk = _trunk_like(model, feats, generator)
    samples = 3
    with torch.no_grad():
        conditioning = model.diffusion_conditioning(trunk.s, trunk.z, trunk.relative_position_encoding, feats)
        per_record = model.structure_module.score_model.single_conditioner.embed_trunk(trunk.s, trunk.s_inputs)
        embedded = per_record.repeat_interleave(samples, 0)
        noisy = torch.randn((samples, feats["atom_pad_mask"].shape[1], 3), generator=generator, device=device)
        times = torch.full((samples,), 0.2, device=device)
        with kernel_policy(enabled=False):
            expected = model.structure_module.score_model(noisy, times, embedded, feats, conditioning, samples)
        bf16_conditioning = type(conditioning)(**{k: v.bfloat16() for k, v in vars(conditioning).items()})
        module_out = module._run_score_model(noisy, times, embedded, feats, bf16_conditioning, samples)
        plan = fast.fast_score.prepare(bf16_conditioning, feats, per_record, samples)
        out = fast._run_fast_score(noisy, times, plan)
        graphs = GraphedCall(fast._run_fast_score, per_call=(True, True, False))
        graphed = graphs(noisy, times, plan).clone()
        replayed = graphs(noisy, times, plan)
    assert torch.isfinite(out).all()
    module_error, error = relative_error(module_out, expected), relative_error(out, expected)
    assert error < 2e-2 and error < 2 * module_error + 1e-3, (error, module_error)
    assert graphs.replays >= 1 and torch.equal(graphed, replayed) and relative_error(graphed, out) < 1e-2


if __name__ == "__main__":
    cases_path, outputs_path = Path(sys.argv[1]), Path(sys.argv[2])
    torch.save(run_kernels(torch.load(cases_path, weights_only=True), "cpu"), outputs_path)


def test_fused_projections_take_over_an_owned_copys_weights(model, dimer):
    """With owns_weights the layers' q/k/v/g and swish/a_to_b weights become views of the fused
    tensors (one copy on the device), and the result is unchanged."""
    import copy

    fast_reference, _, _ = score_both_ways(model, dimer, samples=2)
    owned = copy.deepcopy(model.structure_module.score_model)
    fast = FastScoreModel(owned, owns_weights=True)
    layer = owned.token_transformer.layers[1]
    fused = fast.token_weights
    assert layer.pair_bias_attn.proj_k.weight.data_ptr() == fused.qkvg[1, layer.pair_bias_attn.proj_q.weight.shape[0] :].data_ptr()
    assert layer.transition.a_to_b.weight.untyped_storage().data_ptr() == fused.swiglu.untyped_storage().data_ptr()
    originals = model.structure_module.score_model.token_transformer.layers[1]
    torch.testing.assert_close(layer.pair_bias_attn.proj_k.weight, originals.pair_bias_attn.proj_k.weight, rtol=0, atol=0)
    with torch.no_grad():
        trunk = model.trunk(dimer, recycling_steps=0)
        conditioning = model.diffusion_conditioning(trunk.s, trunk.z, trunk.relative_position_encoding, dimer)
        per_record = owned.single_conditioner.embed_trunk(trunk.s, trunk.s_inputs)
        generator = torch.Generator().manual_seed(0)
        batch, atoms = dimer["atom_pad_mask"].shape
        noisy = 10 * torch.randn(batch * 2, atoms, 3, generator=generator)
        out = fast(noisy, torch.full((batch * 2,), 0.4), fast.prepare(conditioning, dimer, per_record, 2))
    torch.testing.assert_close(out, fast_reference, rtol=0, atol=0)
