"""GPU parity of the kernel backends (bf16 <= 1e-2, fp32 <= 1e-5 relative to the fp32 reference), size-based
selection on this GPU, and CUDA-graph replay. Skipped without CUDA (conftest's gpu marker)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from kernel_testing import relative_error

from foldmill import kernels
from foldmill.fastpath.cuda_graphs import GraphedCall
from foldmill.kernels import cueq, triton_support
from foldmill.kernels.triangle_multiplication import TriangleMultiplicationWeights
from foldmill.model.layers import triangle_attention as triangle_attention_layer
from foldmill.model.layers.attention_pair_bias import attention_pair_bias
from foldmill.model.layers.transition import Transition, transition
from foldmill.model.layers.triangle_attention import TriangleAttention, add_projection, triangle_attention
from foldmill.model.layers.triangle_multiplication import (
    TriangleMultiplicationIncoming,
    TriangleMultiplicationOutgoing,
    triangle_multiplication,
    triangle_multiplication_by_rows,
)

pytestmark = pytest.mark.gpu
BF16_TOL, FP32_TOL = 1e-2, 1e-5
CUDA = torch.device("cuda")


def token_mask(n: int, real: int, seed: int) -> torch.Tensor:
    return (torch.arange(n, device=CUDA) < real).float()[None]


def generator(seed: int) -> torch.Generator:
    return torch.Generator(device=CUDA).manual_seed(seed)


def randomized(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Unit-scale random weights (1/sqrt(fan-in) for matrices), on the GPU, for inference."""
    g = generator(seed)
    module = module.to(CUDA).eval().requires_grad_(False)
    for parameter in module.parameters():
        scale = parameter.shape[-1] ** -0.5 if parameter.dim() > 1 else 1.0
        parameter.data = torch.randn(parameter.shape, device=CUDA, generator=g) * scale
    return module


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
    expected = triangle_attention(q, k, v, bias, mask, scale)[:, : n - 5]  # real rows
    names = backends_to_test("triangle_attention", dtype)
    assert "sdpa" in names
    for name in names:
        with kernels.kernel_policy(force={"triangle_attention": name}):
            args = (q.to(dtype), k.to(dtype), v.to(dtype), bias.to(dtype), mask, scale)
            out = kernels.dispatch("triangle_attention", *args)[:, : n - 5]
        tolerance = FP32_TOL if dtype == torch.float32 else BF16_TOL
        assert relative_error(out, expected) <= tolerance, name


@pytest.mark.parametrize("starting", [True, False])
def test_triangle_attention_module_backends(starting):
    """The module's fused q/k/v/g/bias projection hands every backend strided views of one
    (B, N, N, 520) product (rows 16-byte aligned in bf16); each must accept them."""
    n = 136
    module = randomized(TriangleAttention(128, 32, 4, starting=starting), seed=11)
    x = torch.randn(1, n, n, 128, device=CUDA, generator=generator(12))
    mask1d = token_mask(n, n - 6, n)
    pair_mask = mask1d[:, :, None] * mask1d[:, None, :]
    with torch.no_grad():
        with kernels.kernel_policy(enabled=False):
            expected = module(x, pair_mask, 64)[:, : n - 6, : n - 6]
        for name in backends_to_test("triangle_attention", torch.bfloat16):
            with kernels.kernel_policy(force={"triangle_attention": name}), torch.autocast("cuda", torch.bfloat16):
                out = module(x, pair_mask, 64)[:, : n - 6, : n - 6]
            # Projections and gate are rounded to bf16 too (a layout error would be O(1)).
            assert relative_error(out.float(), expected) <= 2 * BF16_TOL, name


@pytest.mark.parametrize(("batch", "head_dim"), [(1, 24), (2, 24), (1, 32)])
def test_pair_bias_attention_on_the_flash_kernel_matches_the_fp32_math(batch, head_dim):
    """The single track's attention (16 heads x 24, padded to the kernel's 32) through the registry's Triton
    backend: bf16 within BF16_TOL of the fp32 reference, records with their own key masks and bias."""
    _needs_triton()
    n, heads = 301, 16
    g = generator(31)
    q, k, v = (torch.randn(batch, n, heads, head_dim, device=CUDA, generator=g) for _ in range(3))
    bias = 2 * torch.randn(batch, heads, n, n, device=CUDA, generator=g)
    mask = torch.stack([(torch.arange(n, device=CUDA) < n - 7 - 30 * b).float() for b in range(batch)])
    expected = attention_pair_bias(q, k, v, bias, mask, 1e6)
    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
        kernels.reset_counts()
        with kernels.kernel_policy(force={"attention_pair_bias": "triton"}):
            out = kernels.dispatch("attention_pair_bias", q, k, v, bias, mask, 1e6)
    assert kernels.chosen_counts() == {"attention_pair_bias/triton": 1}
    assert out.shape == expected.shape and out.dtype == torch.bfloat16
    assert relative_error(out, expected) <= BF16_TOL


@pytest.mark.parametrize("starting", [True, False])
def test_triangle_attention_module_adds_into_the_pair_by_row_blocks(starting, monkeypatch):
    """As the fast path runs it: bf16 linears, the fp32 pair as residual_out, the projection in blocks of
    40 rows (each block's flash call reusing the bias folded at the first, its output projection
    accumulating into the pair, or into its transpose for the ending node)."""
    monkeypatch.setattr(triangle_attention_layer, "PROJECTION_BLOCK_BYTES", 40 * 136 * 512 * 4)  # x: the fp32 LayerNorm
    n = 136
    module = randomized(TriangleAttention(128, 32, 4, starting=starting), seed=14)
    x = torch.randn(1, n, n, 128, device=CUDA, generator=generator(15))
    mask1d = token_mask(n, n - 6, n)
    pair_mask = mask1d[:, :, None] * mask1d[:, None, :]
    with torch.no_grad():
        with kernels.kernel_policy(enabled=False):
            expected = module(x, pair_mask, 64)[:, : n - 6, : n - 6]
        for linear in (m for m in module.modules() if isinstance(m, torch.nn.Linear)):
            linear.to(torch.bfloat16)
        out = x.clone()
        kernels.reset_counts()
        with kernels.kernel_policy(force={"triangle_attention": "triton"}), torch.autocast("cuda", torch.bfloat16):
            assert module(out, pair_mask, 64, residual_out=out) is out
    assert kernels.chosen_counts()["gated_triangle_attention/triton"] == 4  # 136 rows in blocks of 40
    update = (out - x)[:, : n - 6, : n - 6]
    assert relative_error(update, expected) <= 2 * BF16_TOL


@pytest.mark.parametrize("starting", [True, False])
def test_output_projection_accumulates_into_the_fp32_pair(starting):
    """A bf16 output projection accumulates into blocks of rows of the fp32 pair (starting node) or of
    its transpose (ending node), batch 2: one cuBLAS call per block and batch element, nothing rounded
    to bf16 but the inputs, so within fp32 tolerance of the math."""
    n, rows = 136, 40
    z = torch.randn(2, n, n, 128, device=CUDA, generator=generator(21))
    gated = torch.randn(2, n, n, 128, device=CUDA, generator=generator(22)).bfloat16()
    weight = (torch.randn(128, 128, device=CUDA, generator=generator(23)) / math.sqrt(128)).bfloat16()
    update = gated.double() @ weight.double().t()
    expected = z.double() + (update if starting else update.transpose(1, 2))
    out = z.clone()
    target = out if starting else out.transpose(1, 2)
    for start in range(0, n, rows):
        add_projection(target[:, start : start + rows], gated[:, start : start + rows], weight)
    assert relative_error(out.double(), expected) <= FP32_TOL


@pytest.mark.parametrize("n", [64, 400])
@pytest.mark.parametrize("module_class", [TriangleMultiplicationOutgoing, TriangleMultiplicationIncoming])
def test_triangle_multiplication_backends(n, module_class):
    if not cueq.available():
        pytest.skip("cuEquivariance ops not installed")
    module = randomized(module_class(128), seed=n + 1)
    x = torch.randn(1, n, n, 128, device=CUDA, generator=generator(n + 2))
    mask1d = token_mask(n, n - 3, n)
    pair_mask = mask1d[:, :, None] * mask1d[:, None, :]
    with torch.no_grad():
        expected = module(x, pair_mask)[:, : n - 3, : n - 3]
        with kernels.kernel_policy(force={"triangle_multiplication": "cueq"}), torch.autocast("cuda", torch.bfloat16):
            out = module(x.bfloat16(), pair_mask)[:, : n - 3, : n - 3]
    assert relative_error(out.float(), expected) <= BF16_TOL


@pytest.mark.parametrize("direction", ["outgoing", "incoming"])
def test_triangle_multiplication_by_rows_bf16(direction):
    """The large-input path under bf16 autocast (edges and product in bf16, LayerNorms fp32), blocks of 24 rows."""
    n = 200
    module_class = TriangleMultiplicationOutgoing if direction == "outgoing" else TriangleMultiplicationIncoming
    module = randomized(module_class(128), seed=3)
    x = torch.randn(1, n, n, 128, device=CUDA, generator=generator(4))
    mask1d = token_mask(n, n - 3, n)
    pair_mask = mask1d[:, :, None] * mask1d[:, None, :]
    weights = TriangleMultiplicationWeights(
        module.norm_in.weight, module.norm_in.bias, module.p_in.weight, module.g_in.weight,
        module.norm_out.weight, module.norm_out.bias, module.p_out.weight, module.g_out.weight,
    )  # fmt: skip
    with torch.no_grad():
        expected = triangle_multiplication(x, direction, pair_mask, weights)[:, : n - 3, : n - 3]
        with torch.autocast("cuda", torch.bfloat16):
            out = triangle_multiplication_by_rows(x, direction, pair_mask, weights, rows=24)
    assert out.dtype == torch.bfloat16
    assert relative_error(out[:, : n - 3, : n - 3].float(), expected) <= BF16_TOL


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_pair_bias_attention_sdpa(dtype):
    g = generator(7)
    q, k, v = (torch.randn(5, 150, 16, 48, device=CUDA, generator=g) for _ in range(3))
    bias = torch.randn(5, 16, 150, 150, device=CUDA, generator=g)
    mask = token_mask(150, 140, 7).expand(5, -1)
    expected = attention_pair_bias(q, k, v, bias, mask, 1e6)
    with kernels.kernel_policy(force={"attention_pair_bias": "sdpa"}):
        out = kernels.dispatch("attention_pair_bias", *(t.to(dtype) for t in (q, k, v, bias)), mask, 1e6)
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


def _transition_module(dim: int, seed: int) -> Transition:
    module = randomized(Transition(dim, 4 * dim), seed)
    module.norm.weight.data = 1 + 0.2 * module.norm.weight.data  # LayerNorm scale around 1
    return module


def _needs_triton() -> None:
    if not triton_support.available():
        pytest.skip("triton not installed")


@pytest.mark.parametrize("dim", [128, 384])  # pair track (37 x 37 pair rows), single track (3 x 333 tokens)
@pytest.mark.parametrize("input_dtype", [torch.bfloat16, torch.float32])
def test_triton_transition_under_autocast(dim, input_dtype):
    """As the trunk runs it: fp32 weights, bf16 autocast, the residual stream in bf16 or fp32."""
    _needs_triton()
    module = _transition_module(dim, seed=dim)
    shape = (1, 37, 37, dim) if dim == 128 else (3, 333, dim)
    x = torch.randn(shape, device=CUDA, generator=generator(dim + 1)).to(input_dtype)
    with torch.no_grad():
        with kernels.kernel_policy(enabled=False):
            expected = module(x.float())
        kernels.reset_counts()
        with kernels.kernel_policy(force={"transition": "triton"}), torch.autocast("cuda", torch.bfloat16):
            out = module(x)
    assert kernels.chosen_counts() == {"transition/triton": 1}
    assert out.dtype == torch.bfloat16 and out.shape == expected.shape
    assert relative_error(out, expected) <= BF16_TOL


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_triton_transition_every_block_config(dtype):
    """Each autotuning candidate compiles, fits and is right (weights stored in `dtype`, no autocast)."""
    _needs_triton()
    from foldmill.kernels.transition.triton_kernel import NARROW_CONFIGS, WIDE_CONFIGS, fused_transition

    for dim, configs in ((128, NARROW_CONFIGS), (384, WIDE_CONFIGS)):
        module = _transition_module(dim, seed=dim + 2)
        params = (module.norm.weight, module.norm.bias, module.fc1.weight, module.fc2.weight, module.fc3.weight)
        x = torch.randn(1031, dim, device=CUDA, generator=generator(dim + 3))
        expected = transition(x, *params)
        low = [p.to(dtype) if p.dim() > 1 else p for p in params]
        for config in (*configs, None):  # None: the autotuned launch
            out = fused_transition(x.to(dtype), *low, 1e-5, dtype, config)
            assert relative_error(out, expected) <= BF16_TOL, (dim, config)


def test_triton_transition_replays_in_a_cuda_graph():
    """The first (eager) call tunes; capture and replay then launch the tuned kernel."""
    _needs_triton()
    module = _transition_module(128, seed=9)
    g = generator(10)
    x, other = (torch.randn(1, 48, 48, 128, device=CUDA, generator=g) for _ in range(2))
    with torch.no_grad(), kernels.kernel_policy(force={"transition": "triton"}), torch.autocast("cuda", torch.bfloat16):
        expected = module(other)  # eager warm-up, autotuning included
        static_x = x.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            module(static_x)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = module(static_x)
        static_x.copy_(other)
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_out, expected)
    if torch.cuda.get_device_capability() == (9, 0):  # the shipped sm_90 table: triton first
        assert kernels.select("transition", torch.empty(0, device=CUDA, dtype=torch.bfloat16), 1000) == "triton"


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "bf16"])
def test_triton_layer_norm_matches_the_fp32_norm(layout):
    """As the compute-dtype LayerNorm runs it in the trunk: fp32 pair (or the ending-node transposed view,
    or a bf16 pair) under bf16 autocast -> bf16, through the registry with the Triton backend pinned."""
    _needs_triton()
    from foldmill.model.layers.layer_norm import LayerNorm

    norm = randomized(LayerNorm(128), seed=11)
    norm.weight.data = 1 + 0.2 * norm.weight.data
    z = torch.randn(1, 301, 301, 128, device=CUDA, generator=generator(12)) * 2 + 0.5
    if layout == "transposed":
        z = z.transpose(1, 2)
    if layout == "bf16":
        z = z.bfloat16()
    with torch.no_grad():
        expected = norm(z.float())
        norm.in_compute_dtype = True
        kernels.reset_counts()
        with kernels.kernel_policy(force={"layer_norm": "triton"}), torch.autocast("cuda", torch.bfloat16):
            out = norm(z)
    assert kernels.chosen_counts() == {"layer_norm/triton": 1}
    assert out.dtype == torch.bfloat16 and out.shape == expected.shape
    assert relative_error(out, expected) <= BF16_TOL


@pytest.mark.parametrize(("layout", "heads", "keep_normed"), [("contiguous", 16, False), ("transposed", 4, True)])
def test_triton_layer_norm_heads_matches_the_fp32_norm_and_projection(layout, heads, keep_normed):
    """As the pair-bias attention (16 heads, no norm kept) and the ending-node triangle attention (the
    transposed view, 4 heads, the norm kept) run it: fp32 pair under bf16 autocast, the Triton backend."""
    _needs_triton()
    from foldmill.model.layers.layer_norm import LayerNorm, normed_and_heads

    norm = randomized(LayerNorm(128), seed=13)
    norm.weight.data = 1 + 0.2 * norm.weight.data
    projection = randomized(torch.nn.Linear(128, heads, bias=False), seed=14).to(torch.bfloat16)
    z = torch.randn(1, 301, 301, 128, device=CUDA, generator=generator(15)) * 2 + 0.5
    if layout == "transposed":
        z = z.transpose(1, 2)
    with torch.no_grad():
        expected_normed = norm(z)
        expected = (expected_normed @ projection.weight.float().T).permute(0, 3, 1, 2)
        norm.in_compute_dtype = True
        kernels.reset_counts()
        with kernels.kernel_policy(force={"layer_norm_heads": "triton"}), torch.autocast("cuda", torch.bfloat16):
            normed, out = normed_and_heads(norm, projection, z, keep_normed)
    assert kernels.chosen_counts() == {"layer_norm_heads/triton": 1}
    assert out.dtype == torch.bfloat16 and out.shape == expected.shape and out.is_contiguous()
    assert relative_error(out, expected) <= BF16_TOL
    if keep_normed:
        assert normed.dtype == torch.bfloat16 and relative_error(normed, expected_normed) <= BF16_TOL
    else:
        assert normed is None


@dataclasses.dataclass
class Conditioning:
    scale: torch.Tensor


def _affine(x: torch.Tensor, feats: dict, conditioning: Conditioning, repeats: int) -> torch.Tensor:
    return (x @ feats["weight"] * conditioning.scale).repeat(repeats, 1)


def test_graphed_call_replays_and_recaptures_for_new_conditioning():
    g = generator(3)
    feats = {"weight": torch.randn(16, 16, device=CUDA, generator=g), "unused": torch.randn(4, device=CUDA)}
    conditioning = Conditioning(torch.tensor(2.0, device=CUDA))
    graphed = GraphedCall(_affine, per_call=(True, False, False, False), min_free_bytes=0)
    for step in range(3):
        x = torch.randn(8, 16, device=CUDA, generator=g)
        torch.testing.assert_close(graphed(x, feats, conditioning, 2), _affine(x, feats, conditioning, 2))
    assert graphed.captures == 1 and graphed.replays == 3
    # Conditioning is read in place: a new value in the same tensor needs no recapture.
    conditioning.scale.fill_(-1.0)
    x = torch.randn(8, 16, device=CUDA, generator=g)
    torch.testing.assert_close(graphed(x, feats, conditioning, 2), _affine(x, feats, conditioning, 2))
    assert graphed.captures == 1
    # A new sampling run with other conditioning tensors (other addresses): the stale graph is recaptured.
    conditioning = Conditioning(torch.tensor(3.0, device=CUDA))
    feats = {"weight": torch.randn(16, 16, device=CUDA, generator=g), "unused": feats["unused"]}
    x = torch.randn(8, 16, device=CUDA, generator=g)
    torch.testing.assert_close(graphed(x, feats, conditioning, 2), _affine(x, feats, conditioning, 2))
    assert graphed.captures == 2
    # Another shape: another graph.
    x = torch.randn(4, 16, device=CUDA, generator=g)
    torch.testing.assert_close(graphed(x, feats, conditioning, 2), _affine(x, feats, conditioning, 2))
    assert graphed.captures == 3


def test_graph_memory_guard_runs_eagerly():
    graphed = GraphedCall(_affine, per_call=(True, False, False, False), min_free_bytes=1 << 60)
    feats = {"weight": torch.eye(4, device=CUDA)}
    x = torch.ones(2, 4, device=CUDA)
    out = graphed(x, feats, Conditioning(torch.tensor(3.0, device=CUDA)), 1)
    torch.testing.assert_close(out, 3 * x)
    assert graphed.captures == 0 and "memory guard" in next(iter(graphed.eager_reasons.values()))


def test_fast_path_on_gpu_graphs_equal_eager(data_dir):
    from foldmill.bench._inputs import load_features
    from foldmill.fastpath.runner import FastBoltz2, FastPathOptions
    from foldmill.model import Boltz2Config, InferenceRecipe, demo_model

    # Featurized with foldmill.bench._inputs (BenchInput((130, 167))): the GPU machine has no CCD.
    feats = load_features(data_dir / "features_130+167.npz", CUDA)
    model = demo_model(Boltz2Config.small(), seed=1).to(CUDA)
    recipe = InferenceRecipe(recycling_steps=1, sampling_steps=6, diffusion_samples=3, max_parallel_samples=2, seed=3)
    graphed = FastBoltz2(model, FastPathOptions(max_confidence_graph_tokens=512))
    eager = FastBoltz2(model, FastPathOptions(cuda_graphs=False))
    out_graphed, out_eager = graphed.predict(feats, recipe), eager.predict(feats, recipe)
    assert graphed.graphs.captures == 1  # one graph of the whole step, chunks of 2 and 1 samples inside
    assert len(graphed.graphs) == 0  # dropped after sampling: it would hold the run's conditioning
    for name in ("sample_atom_coords", "plddt", "pae"):
        assert relative_error(out_graphed[name], out_eager[name]) <= 1e-5, name
    # A second target of the same size replays the trunk's and the confidence pairformer's graphs (the
    # latter one per chunk of samples: 2 and 1).
    confidence_graphs = graphed.network.confidence_module.pairformer_stack.graphs
    assert confidence_graphs.captures == 2 and confidence_graphs.replays == 2
    again = graphed.predict(feats, recipe)
    assert confidence_graphs.captures == 2 and confidence_graphs.replays == 4
    assert graphed.network.pairformer_module.graphs.replays >= 2
    for name in ("sample_atom_coords", "plddt", "pae"):
        assert relative_error(again[name], out_eager[name]) <= 1e-5, name
    reference = FastBoltz2(model, FastPathOptions(precision="fp32", kernels=False)).predict(feats, recipe)
    assert (out_graphed["plddt"] - reference["plddt"]).abs().max() < 0.05
