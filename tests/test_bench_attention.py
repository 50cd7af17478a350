"""The MoE bench's attention section: records as variable-length bounds, FLOPs of the pairs each
mask keeps, and cases that compute attention under their mask (CPU here; FlashAttention 4 on the
GPU, where installed)."""

from __future__ import annotations

import pytest
import torch
from kernel_testing import relative_error

from foldmill.bench._attention import (
    AttentionInputs,
    attention_cases,
    attention_flops,
    attention_inputs,
    packed_records,
    record_bounds,
)
from foldmill.bench.moe import parse_sections
from foldmill.moe.config import ModelConfig
from foldmill.moe.kernels.flash_attention_4 import flash_attention_4_installed
from foldmill.moe.model.attention import positions_in_document

CONFIG = ModelConfig(hidden_size=64, num_heads=4, num_kv_heads=2)


def test_record_bounds_mark_each_record_and_each_window_end() -> None:
    ids = torch.tensor([[0, 0, 1, 1, 1], [4, 5, 5, 6, 6]])
    bounds, longest = record_bounds(ids)
    assert bounds.dtype == torch.int32
    assert bounds.tolist() == [0, 2, 5, 6, 8, 10]
    assert longest == 3


def test_record_bounds_restart_positions_as_the_model_does() -> None:
    ids = packed_records(2, 4096)
    bounds, longest = record_bounds(ids)
    positions = torch.cat([torch.arange(int(n)) for n in bounds.diff()])
    assert torch.equal(positions, positions_in_document(ids).flatten())
    assert longest <= 800


def test_packed_records_are_50_to_800_tokens_and_the_same_every_run() -> None:
    ids = packed_records(2, 4096)
    assert torch.equal(ids, packed_records(2, 4096))
    for row in ids:
        lengths = torch.unique_consecutive(row, return_counts=True)[1]
        assert lengths.sum() == 4096
        assert ((lengths[:-1] >= 50) & (lengths[:-1] <= 800)).all()  # the last is cut by the window's end


def test_attention_flops_count_the_pairs_each_mask_keeps() -> None:
    batch, seq, heads, dim = 2, 4096, 16, 128
    causal = attention_flops(torch.zeros(batch, seq, dtype=torch.int64), heads, dim)
    # Forward 2 GEMMs, backward 5, each 2 x dim FLOPs per kept pair and head: 481 GFLOP at this shape.
    assert causal == 14 * dim * heads * batch * seq * (seq + 1) // 2
    records = attention_flops(packed_records(batch, seq), heads, dim)
    assert 0 < records < causal / 5


def test_the_attention_section_is_one_of_the_bench_sections() -> None:
    assert "attention" in parse_sections("step,attention")


def test_flash_attention_4_is_reported_missing_rather_than_raising(monkeypatch) -> None:
    monkeypatch.setattr("importlib.util.find_spec", lambda name: (_ for _ in ()).throw(ImportError(name)))
    assert flash_attention_4_installed() is False


def test_every_case_computes_attention_under_its_mask() -> None:
    """Forward and gradients of each case against the float32 reference of its mask; the two
    masks' references differ, so a case that ignored its mask would fail."""
    torch.manual_seed(0)
    inputs = attention_inputs(CONFIG, batch=2, seq_len=512, device=torch.device("cpu"))
    references = {masked: inputs.reference(masked) for masked in (False, True)}
    assert relative_error(references[True][0], references[False][0]) > 0.1
    cases = attention_cases(inputs.documents)
    assert {case.within_records for case in cases} == {False, True}
    for case in cases:
        out, grads = inputs.forward_backward(case)
        out_ref, grads_ref = references[case.within_records]
        assert out.shape == (2, 512, CONFIG.hidden_size)
        assert relative_error(out.detach(), out_ref) < 1e-2, case.variant
        for grad, grad_ref in zip(grads, grads_ref):
            assert relative_error(grad, grad_ref) < 2e-2, case.variant


@pytest.mark.gpu
@pytest.mark.skipif(not flash_attention_4_installed(), reason="needs flash-attn-4 (pip install flash-attn-4)")
def test_flash_attention_4_is_as_close_to_float32_as_foldmills_attention() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    config = ModelConfig(hidden_size=2048, num_heads=16, num_kv_heads=8)
    inputs: AttentionInputs = attention_inputs(config, batch=2, seq_len=2048, device=torch.device("cuda"))
    cases = attention_cases(inputs.documents)
    for masked in (False, True):
        out_ref, grads_ref = inputs.reference(masked)
        errors = {}
        for case in (case for case in cases if case.within_records == masked):
            out, grads = inputs.forward_backward(case)
            errors[case.variant] = (relative_error(out.detach(), out_ref),
                                    max(relative_error(g, r) for g, r in zip(grads, grads_ref)))
        foldmill = next(error for variant, error in errors.items() if variant.startswith("foldmill torch"))
        flash = [error for variant, error in errors.items() if "FlashAttention 4" in variant]
        assert len(flash) == (2 if masked else 1), errors
        for out_error, grad_error in flash:
            assert out_error <= 2 * foldmill[0] + 1e-3, errors
            assert grad_error <= 2 * foldmill[1] + 1e-3, errors
