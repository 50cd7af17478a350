"""Kernel registry (foldmill.kernels) on CPU: selection logic, fallbacks, crossover tables, SDPA parity.

GPU parity of cuEquivariance/SDPA in bf16 and fp32 is in test_kernels_gpu.py.
"""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch

from foldmill import kernels
from foldmill.kernels import crossover, cueq, registry
from foldmill.kernels.attention_pair_bias import sdpa as pair_bias_sdpa
from foldmill.kernels.registry import REFERENCE, Backend, KernelPolicy, OpSpec
from foldmill.kernels.triangle_attention import sdpa
from foldmill.model.layers.attention_pair_bias import attention_pair_bias
from foldmill.model.layers.triangle_attention import TriangleAttentionStartingNode, triangle_attention

FP32_TOL = 1e-5


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    return float((value.double() - reference.double()).norm() / reference.double().norm())


def triangle_inputs(seed: int = 0, batch: int = 2, rows: int = 7, heads: int = 3, keys: int = 9, dim: int = 8):
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, rows, heads, keys, dim, generator=generator) for _ in range(3))
    bias = torch.randn(batch, 1, heads, keys, keys, generator=generator)
    token_mask = torch.rand(batch, keys, generator=generator) > 0.3
    mask = (token_mask[:, :rows, None] & token_mask[:, None, :])[:, :, None, None, :]  # padded rows too
    return q, k, v, bias, mask, 1 / math.sqrt(dim)


def test_cpu_always_runs_the_reference():
    x = torch.zeros(1, 4, 4, 8)
    for op in ("triangle_multiplication", "triangle_attention", "attention_pair_bias"):
        assert kernels.select(op, x, 4) == REFERENCE
        with kernels.kernel_policy(enabled=False):
            assert kernels.select(op, x, 4) == REFERENCE


def test_candidate_order_follows_the_measured_table_on_cuda():
    policy = KernelPolicy()
    trimul_small = registry.candidate_order("triangle_multiplication", "cuda", "sm_90", torch.bfloat16, 256, policy)
    trimul_large = registry.candidate_order("triangle_multiplication", "cuda", "sm_90", torch.bfloat16, 1024, policy)
    # foldmill's Triton triangle multiplication measured fastest at every size; below ~450
    # tokens the reference beat cuEquivariance's.
    assert trimul_small[:2] == ["triton", REFERENCE] and trimul_large[:2] == ["triton", "cueq"]
    # foldmill's Triton flash triangle attention measured fastest at every size (2026-12-01, after its
    # padding-row GPU test passed), cuEquivariance's next from ~200 tokens.
    attention = registry.candidate_order("triangle_attention", "cuda", "sm_90", torch.bfloat16, 512, policy)
    assert attention[:2] == ["triton", "cueq"]
    # At 128 tokens cuEquivariance's attention was the slowest measured (launch-bound): never first there.
    assert registry.candidate_order("triangle_attention", "cuda", "sm_90", torch.bfloat16, 128, policy)[0] != "cueq"
    assert registry.candidate_order("transition", "cuda", "sm_90", torch.bfloat16, 1024, policy)[0] == "triton"
    # No table for the architecture: conservative defaults; fp32 never picks cuEquivariance.
    assert registry.candidate_order("triangle_multiplication", "cuda", "sm_75", torch.bfloat16, 4096, policy) == [
        REFERENCE
    ]
    assert "cueq" not in registry.candidate_order("triangle_attention", "cuda", "sm_90", torch.float32, 512, policy)
    # Disabled, CPU, forced: the reference always closes the list.
    assert registry.candidate_order(
        "triangle_attention", "cuda", "sm_90", torch.bfloat16, 512, KernelPolicy(False)
    ) == [REFERENCE]
    forced = KernelPolicy(force={"triangle_attention": "sdpa"})
    assert registry.candidate_order("triangle_attention", "cpu", None, torch.float32, 9, forced) == ["sdpa", REFERENCE]


def test_force_unknown_backend_is_refused():
    with (
        pytest.raises(ValueError, match="unknown op/backend"),
        kernels.kernel_policy(force={"triangle_attention": "x"}),
    ):
        pass


def test_cuequivariance_degrades_cleanly_without_its_ops():
    assert isinstance(cueq.available(), bool)  # never raises, whatever is installed
    q, k, v, bias, mask, scale = triangle_inputs()
    with kernels.kernel_policy(force={"triangle_attention": "cueq"}):
        # cueq is CUDA-only: on CPU the forced choice falls back to the reference.
        assert kernels.select("triangle_attention", q, q.shape[-2]) == REFERENCE
        out = kernels.dispatch("triangle_attention", q, k, v, bias, mask, scale)
    torch.testing.assert_close(out, triangle_attention(q, k, v, bias, mask, scale), rtol=0, atol=0)


def test_sdpa_triangle_attention_matches_reference_fp32():
    q, k, v, bias, mask, scale = triangle_inputs()
    assert (
        relative_error(
            sdpa.triangle_attention(q, k, v, bias, mask, scale), triangle_attention(q, k, v, bias, mask, scale)
        )
        <= FP32_TOL
    )


def test_sdpa_pair_bias_attention_matches_reference_fp32():
    generator = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(3, 10, 4, 16, generator=generator) for _ in range(3))
    bias = torch.randn(3, 4, 10, 10, generator=generator)
    mask = (torch.rand(3, 10, generator=generator) > 0.2).float()
    expected = attention_pair_bias(q, k, v, bias, mask, 1e6)
    assert relative_error(pair_bias_sdpa.attention_pair_bias(q, k, v, bias, mask, 1e6), expected) <= FP32_TOL


def test_pair_bias_attention_triton_backend_defers_where_the_kernel_does_not_apply():
    """Autograd recording, or heads wider than the flash kernel's 64: SDPA's backend runs instead."""

    generator = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 9, 4, 24, generator=generator) for _ in range(3))
    bias = torch.randn(2, 4, 9, 9, generator=generator)
    mask = (torch.rand(2, 9, generator=generator) > 0.2).float()
    q.requires_grad_()
    out = kernels.call_backend("attention_pair_bias", "triton", q, k, v, bias, mask, 1e6)
    assert torch.equal(out, pair_bias_sdpa.attention_pair_bias(q, k, v, bias, mask, 1e6))
    out.sum().backward()
    assert q.grad is not None
    wide = [torch.randn(1, 5, 2, 96, generator=generator) for _ in range(3)]
    out = kernels.call_backend("attention_pair_bias", "triton", *wide, bias[:1, :2, :5, :5], mask[:1, :5], 1e6)
    assert torch.equal(out, pair_bias_sdpa.attention_pair_bias(*wide, bias[:1, :2, :5, :5], mask[:1, :5], 1e6))


def test_modules_route_through_the_registry():
    module = TriangleAttentionStartingNode(c_in=12, c_hidden=4, num_heads=3).eval()
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(1, 9, 9, 12, generator=generator)
    token_mask = torch.tensor([[1.0] * 7 + [0.0] * 2])
    pair_mask = token_mask[:, :, None] * token_mask[:, None, :]
    kernels.reset_counts()
    with torch.no_grad():
        expected = module(x, pair_mask, chunk_size=4)
        with kernels.kernel_policy(force={"triangle_attention": "sdpa"}):
            routed = module(x, pair_mask, chunk_size=4)
    counts = kernels.chosen_counts()
    assert counts["triangle_attention/reference"] == 3 and counts["triangle_attention/sdpa"] == 3  # 3 row chunks
    assert relative_error(routed, expected) <= FP32_TOL


def test_load_backends_imports_only_the_backends_the_registry_picks_first(monkeypatch):
    checked = []
    dtypes = frozenset({torch.float32, torch.float16})

    def backend(name: str, available: bool) -> Backend:
        return Backend(name, lambda x: x, frozenset({"cuda"}), dtypes, lambda: checked.append(name) is None and available)

    backends = (backend("gone", False), backend("first", True), backend("second", True))
    # The fp16 order is not the runner's (fp32 here): it must not be consulted.
    order = {"float32": ["gone", "first", "second"], "float16": ["second"]}
    registry.register_op("probe_op", OpSpec(tokens=lambda x: x.shape[0], backends=backends, default_order=order))
    monkeypatch.setattr(registry, "_arch", lambda device: "sm_test")  # no measured table: the default order
    try:
        loaded = kernels.load_backends("cuda", [torch.float32])
        on_cpu = kernels.load_backends("cpu", [torch.float32])
    finally:
        registry._ops.pop("probe_op")
        registry._choices.clear()
    assert "probe_op/first" in loaded and "probe_op/gone" not in loaded and "probe_op/second" not in loaded
    assert checked == ["gone", "first"]  # the second's package is never imported: the first runs, fp16 is not used
    assert not [name for name in on_cpu if name.startswith("probe_op/")]  # CPU runs the reference


@pytest.fixture
def fake_op():
    """A test op with one backend whose behaviour the test sets."""
    behaviour = {}

    def backend(x: torch.Tensor) -> torch.Tensor:
        raise behaviour["error"]

    registry.register_op(
        "fake_op",
        OpSpec(
            tokens=lambda x: x.shape[0],
            backends=(Backend("fake", backend, frozenset({"cpu"}), frozenset({torch.float32})),),
        ),
    )
    registry.register_reference("fake_op", lambda t: t * 2)
    yield behaviour
    registry._ops.pop("fake_op")
    registry._references.pop("fake_op")
    registry._retired.pop(("fake_op", "fake"), None)
    registry._choices.clear()


def test_backend_that_cannot_run_is_retired_with_one_warning(fake_op):
    fake_op["error"] = ImportError("no ops library")
    x = torch.ones(3)
    with kernels.kernel_policy(force={"fake_op": "fake"}):
        with pytest.warns(RuntimeWarning, match="fake_op/fake unavailable"):
            assert kernels.dispatch("fake_op", x).tolist() == [2.0, 2.0, 2.0]
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # retired: no second warning, straight to the reference
            assert kernels.dispatch("fake_op", x).tolist() == [2.0, 2.0, 2.0]
    assert "fake_op/fake" in kernels.retired_backends()


def test_backend_errors_that_are_bugs_propagate(fake_op):
    fake_op["error"] = ValueError("shape mismatch")
    with kernels.kernel_policy(force={"fake_op": "fake"}), pytest.raises(ValueError, match="shape mismatch"):
        kernels.dispatch("fake_op", torch.ones(2))


def test_table_from_timings_places_switches_between_measured_sizes():
    rows = crossover.table_from_timings(
        {
            "reference": {"128": 0.2, "256": 0.6, "512": 2.8, "1024": 18.0},
            "cueq": {128: 1.2, 256: 1.3, 512: 1.4, 1024: 2.6},
        }
    )
    assert rows == [
        {"max_tokens": int(math.sqrt(256 * 512)), "order": ["reference", "cueq"]},
        {"max_tokens": None, "order": ["cueq", "reference"]},
    ]
    assert crossover.lookup(rows, 362) == ["reference", "cueq"]
    assert crossover.lookup(rows, 363) == ["cueq", "reference"]
    # A backend that failed at a size (None) is ranked where it was measured only.
    assert crossover.table_from_timings({"a": {"8": 1.0, "16": None}, "b": {"8": 2.0, "16": 3.0}}) == [
        {"max_tokens": 11, "order": ["a", "b"]},
        {"max_tokens": None, "order": ["b"]},
    ]


def test_shipped_sm90_table_and_override_directory(tmp_path, monkeypatch):
    assert crossover.order("sm_90", "triangle_multiplication", "bfloat16", 256)[1] == REFERENCE
    assert crossover.order("sm_90", "triangle_multiplication", "bfloat16", 1024)[1] == "cueq"
    assert crossover.order("sm_90", "triangle_multiplication", "float32", 1024) is None
    table = {
        "arch": "sm_90",
        "ops": {"triangle_multiplication": {"bfloat16": [{"max_tokens": None, "order": ["cueq"]}]}},
    }
    (tmp_path / "crossover_sm90.json").write_text(json.dumps(table))
    monkeypatch.setenv(crossover.ENV_DIR, str(tmp_path))
    assert crossover.order("sm_90", "triangle_multiplication", "bfloat16", 100) == ["cueq"]
    assert crossover.order("sm_80", "triangle_multiplication", "bfloat16", 100) is None  # no table for sm_80
