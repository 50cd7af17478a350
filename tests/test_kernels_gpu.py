"""GPU parity of the kernel backends (bf16 <= 1e-2, fp32 <= 1e-5 relative to the fp32 reference), size-based
selection on this GPU, and CUDA-graph replay. Skipped without CUDA (conftest's gpu marker)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from foldmill import kernels
from foldmill.kernels import cueq
from foldmill.kernels.cuda_graphs import GraphedCall
from foldmill.model.layers.attention_pair_bias import attention_with_pair_bias
from foldmill.model.layers.triangle_attention import triangle_attention_core
from foldmill.model.layers.triangle_multiplication import TriangleMultiplicationIncoming, TriangleMultiplicationOutgoing

pytestmark = pytest.mark.gpu
BF16_TOL, FP32_TOL = 1e-2, 1e-5
CUDA = torch.device("cuda")


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    return float((value.double() - reference.double()).norm() / reference.double().norm())


def token_mask(n: int, real: int, seed: int) -> torch.Tensor:
    return (torch.arange(n, device=CUDA) < real).float()[None]


def generator(seed: int) -> torch.Generator:
    return torch.Generator(device=CUDA).manual_seed(seed)


def backends_to_test(op: str, dtype: torch.dtype) -> list[str]:
    names = [name for name in kernels.backend_names(op) if name != kernels.REFERENCE]
    probe = torch.empty(0, device=CUDA, dtype=dtype)
    usable = []
    for name in names:
        with kernels.kernel_policy(force={op: name}):
            if kernels.select(op, probe, 64) == name:
                usable.append(name)
    return usable


@pytest.mark.parametrize("n", [72, 200])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_triangle_attention_backends(n, dtype):
    g = generator(n)
    q, k, v = (torch.randn(1, n, 4, n, 32, device=CUDA, generator=g) for _ in range(3))
    bias = torch.randn(1, 1, 4, n, n, device=CUDA, generator=g)
    mask1d = token_mask(n, n - 5, n)
    mask = (mask1d[:, :, None] * mask1d[:, None, :]).bool()[:, :, None, None, :]
    scale = 1 / math.sqrt(32)
    expected = triangle_attention_core(q, k, v, bias, mask, scale)[:, : n - 5]  # real rows
    names = backends_to_test("triangle_attention", dtype)
    assert "sdpa" in names
    for name in names:
        with kernels.kernel_policy(force={"triangle_attention": name}):
            args = (q.to(dtype), k.to(dtype), v.to(dtype), bias.to(dtype), mask, scale)
            out = kernels.dispatch("triangle_attention", triangle_attention_core, *args)[:, : n - 5]
        tolerance = FP32_TOL if dtype == torch.float32 else BF16_TOL
        assert relative_error(out, expected) <= tolerance, name


@pytest.mark.parametrize("n", [64, 400])
@pytest.mark.parametrize("module_class", [TriangleMultiplicationOutgoing, TriangleMultiplicationIncoming])
def test_triangle_multiplication_backends(n, module_class):
    if not cueq.available():
        pytest.skip("cuEquivariance ops not installed")
    g = generator(n + 1)
    module = module_class(128).to(CUDA).eval()
    for parameter in module.parameters():
        scale = parameter.shape[-1] ** -0.5 if parameter.dim() > 1 else 1.0
        parameter.data = torch.randn(parameter.shape, device=CUDA, generator=g) * scale
    x = torch.randn(1, n, n, 128, device=CUDA, generator=g)
    mask1d = token_mask(n, n - 3, n)
    pair_mask = mask1d[:, :, None] * mask1d[:, None, :]
    with torch.no_grad():
        expected = module(x, pair_mask)[:, : n - 3, : n - 3]
        with kernels.kernel_policy(force={"triangle_multiplication": "cueq"}), torch.autocast("cuda", torch.bfloat16):
            out = module(x.bfloat16(), pair_mask)[:, : n - 3, : n - 3]
    assert relative_error(out.float(), expected) <= BF16_TOL


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_pair_bias_attention_sdpa(dtype):
    g = generator(7)
    q, k, v = (torch.randn(5, 150, 16, 48, device=CUDA, generator=g) for _ in range(3))
    bias = torch.randn(5, 16, 150, 150, device=CUDA, generator=g)
    mask = token_mask(150, 140, 7).expand(5, -1)
    expected = attention_with_pair_bias(q, k, v, bias, mask, 1e6)
    with kernels.kernel_policy(force={"attention_pair_bias": "sdpa"}):
        out = kernels.dispatch(
            "attention_pair_bias", attention_with_pair_bias, *(t.to(dtype) for t in (q, k, v, bias)), mask, 1e6
        )
    assert relative_error(out, expected) <= (FP32_TOL if dtype == torch.float32 else BF16_TOL)


def test_selection_on_this_gpu_follows_its_table():
    from foldmill.kernels import crossover

    major, minor = torch.cuda.get_device_capability()
    probe = torch.empty(0, device=CUDA, dtype=torch.bfloat16)
    for n in (128, 1024):
        order = crossover.order(f"sm_{major}{minor}", "triangle_multiplication", "bfloat16", n)
        chosen = kernels.select("triangle_multiplication", probe, n)
        if order is not None:
            available = [
                name
                for name in order
                if name == kernels.REFERENCE or name in backends_to_test("triangle_multiplication", torch.bfloat16)
            ]
            assert chosen == available[0]
    assert kernels.select("triangle_attention", torch.empty(0, device=CUDA), 256) != "cueq"  # fp32: never cuEq


@dataclasses.dataclass
class Conditioning:
    scale: torch.Tensor


def _affine(x: torch.Tensor, feats: dict, conditioning: Conditioning, repeats: int) -> torch.Tensor:
    return (x @ feats["weight"] * conditioning.scale).repeat(repeats, 1)


def test_graphed_call_replays_and_reloads_conditioning():
    g = generator(3)
    feats = {"weight": torch.randn(16, 16, device=CUDA, generator=g), "unused": torch.randn(4, device=CUDA)}
    conditioning = Conditioning(torch.tensor(2.0, device=CUDA))
    graphed = GraphedCall(_affine, per_call=(True, False, False, False), min_free_bytes=0)
    for step in range(3):
        x = torch.randn(8, 16, device=CUDA, generator=g)
        torch.testing.assert_close(graphed(x, feats, conditioning, 2), _affine(x, feats, conditioning, 2))
    assert graphed.captures == 1 and graphed.replays == 3
    # A new sampling run with other conditioning tensors: reloaded after new_generation().
    conditioning = Conditioning(torch.tensor(-1.0, device=CUDA))
    feats = {"weight": torch.randn(16, 16, device=CUDA, generator=g), "unused": feats["unused"]}
    graphed.new_generation()
    x = torch.randn(8, 16, device=CUDA, generator=g)
    torch.testing.assert_close(graphed(x, feats, conditioning, 2), _affine(x, feats, conditioning, 2))
    # Another shape: a second graph.
    x = torch.randn(4, 16, device=CUDA, generator=g)
    torch.testing.assert_close(graphed(x, feats, conditioning, 2), _affine(x, feats, conditioning, 2))
    assert graphed.captures == 2


def test_graph_memory_guard_runs_eagerly():
    graphed = GraphedCall(_affine, per_call=(True, False, False, False), min_free_bytes=1 << 60)
    feats = {"weight": torch.eye(4, device=CUDA)}
    x = torch.ones(2, 4, device=CUDA)
    out = graphed(x, feats, Conditioning(torch.tensor(3.0, device=CUDA)), 1)
    torch.testing.assert_close(out, 3 * x)
    assert graphed.captures == 0 and "memory guard" in next(iter(graphed.eager_reasons.values()))


def test_fast_path_on_gpu_graphs_equal_eager():
    pytest.importorskip("biotite")  # the featurizer's CCD
    from foldmill.bench._inputs import BenchInput, featurize_input
    from foldmill.model import Boltz2Config, InferenceRecipe, demo_model
    from foldmill.model.fastpath import FastBoltz2, FastPathOptions

    feats = {name: value.to(CUDA) for name, value in featurize_input(BenchInput((30, 21), msa_depth=8)).items()}
    model = demo_model(Boltz2Config.small(), seed=1).to(CUDA)
    recipe = InferenceRecipe(recycling_steps=1, sampling_steps=6, diffusion_samples=3, max_parallel_samples=2, seed=3)
    graphed = FastBoltz2(model, FastPathOptions())
    eager = FastBoltz2(model, FastPathOptions(cuda_graphs=False))
    out_graphed, out_eager = graphed.predict(feats, recipe), eager.predict(feats, recipe)
    assert graphed.graphs.captures == 2  # chunks of 2 and 1 samples
    for name in ("sample_atom_coords", "plddt", "pae"):
        assert relative_error(out_graphed[name], out_eager[name]) <= 1e-5, name
    reference = FastBoltz2(model, FastPathOptions(precision="fp32", kernels=False)).predict(feats, recipe)
    assert (out_graphed["plddt"] - reference["plddt"]).abs().max() < 0.05
