"""Document masking: a window of packed records computes what each record computes alone."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from foldmill.moe.config import ModelConfig
from foldmill.moe.data.loader import document_ids
from foldmill.moe.data.tokenizers import BOS, EOS, TOKENIZERS
from foldmill.moe.model.attention import attend, document_mask, positions_in_document
from foldmill.moe.model.decoder import MoEDecoder

CONFIG = ModelConfig(hidden_size=64, ffn_size=64, num_layers=2, num_heads=4, num_kv_heads=2, num_experts=4,
                     top_k=2, vocab_size=30, max_seq_len=64)
RECORDS = ["MKVLAAGIVG", "ST", "WYHHEDKRPLLNQ", "GAVLIMCFWP"]


def packed_window() -> tuple[torch.Tensor, list[torch.Tensor]]:
    """A window that starts inside a record (its tail), then whole records, then a cut-off head."""
    encoded = [torch.from_numpy(TOKENIZERS["protein"].encode(r).astype("int64")) for r in RECORDS]
    pieces = [encoded[0][4:], encoded[1], encoded[2], encoded[3][:6]]
    return torch.cat(pieces).unsqueeze(0), pieces


def test_document_ids_start_a_record_at_every_bos_and_positions_restart() -> None:
    window, pieces = packed_window()
    ids = document_ids(window)[0]
    assert ids.dtype == torch.int32
    expected = torch.cat([torch.full((len(p),), n) for n, p in enumerate(pieces)])
    assert torch.equal(ids, expected.int())
    positions = positions_in_document(ids.unsqueeze(0))[0]
    assert torch.equal(positions, torch.cat([torch.arange(len(p)) for p in pieces]))
    assert int((window[0] == EOS).sum()) == 3 and int((window[0] == BOS).sum()) == 3


def test_dense_mask_is_block_diagonal_causal() -> None:
    ids = torch.tensor([[0, 0, 1, 1, 1, 2]])
    dense = document_mask(ids, "sdpa").dense[0, 0]
    expected = torch.zeros(6, 6, dtype=torch.bool)
    for start, stop in ((0, 2), (2, 5), (5, 6)):
        expected[start:stop, start:stop] = torch.ones(stop - start, stop - start, dtype=torch.bool).tril()
    assert torch.equal(dense, expected)


@pytest.mark.parametrize("backend", ["grouped", "mxfp8"])
def test_packed_window_logits_equal_each_record_alone(backend: str) -> None:
    torch.manual_seed(0)
    model = MoEDecoder(dataclasses.replace(CONFIG, expert_backend=backend)).eval()
    window, pieces = packed_window()
    with torch.no_grad():
        packed = model(window, document_ids(window)).logits[0]
        alone = [model(piece.unsqueeze(0)).logits[0] for piece in pieces]
        unmasked = model(window).logits[0]
    start = 0
    for piece, logits in zip(pieces, alone):
        stop = start + len(piece)
        torch.testing.assert_close(packed[start:stop], logits, atol=2e-5, rtol=1e-4)
        start = stop
    # Without the mask, later records see earlier ones and sit at other RoPE positions.
    first_after = len(pieces[0])
    assert not torch.allclose(unmasked[first_after:], packed[first_after:], atol=1e-3)


def test_masked_gradients_do_not_cross_records() -> None:
    torch.manual_seed(0)
    model = MoEDecoder(CONFIG)
    window, pieces = packed_window()
    embedded = model.embedding.weight
    logits = model(window, document_ids(window)).logits[0]
    # The loss of the last record alone must not reach the embeddings of tokens only earlier records hold.
    logits[-len(pieces[-1]):].sum().backward()
    own = set(pieces[-1].tolist())
    others = set(torch.cat(pieces[:-1]).tolist()) - own
    assert others
    assert all(float(embedded.grad[t].abs().sum()) == 0.0 for t in others)
    assert any(float(embedded.grad[t].abs().sum()) > 0.0 for t in own)


@pytest.mark.gpu
def test_flex_attention_matches_the_dense_mask_on_gpu() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    generator = torch.Generator(device="cuda").manual_seed(0)
    batch, heads, kv_heads, seq, dim = 2, 8, 4, 1024, 128
    q = torch.randn(batch, seq, heads, dim, device="cuda", dtype=torch.bfloat16, generator=generator)
    k = torch.randn(batch, seq, kv_heads, dim, device="cuda", dtype=torch.bfloat16, generator=generator)
    v = torch.randn(batch, seq, kv_heads, dim, device="cuda", dtype=torch.bfloat16, generator=generator)
    lengths = torch.randint(70, 400, (2, 16), generator=torch.Generator().manual_seed(1))
    ids = torch.stack([torch.repeat_interleave(torch.arange(16), row)[:seq] for row in lengths]).cuda()
    grads = {}
    for implementation in ("flex", "sdpa"):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out = attend(*leaves, document_mask(ids, implementation))
        out.float().square().sum().backward()
        grads[implementation] = (out.detach().float(), *(t.grad.float() for t in leaves))
    for flex, dense in zip(grads["flex"], grads["sdpa"]):
        # Two bf16 kernels round differently: a few elements differ by one bf16 step (2^-5 near 5),
        # so hold the whole tensor to a relative error and each element to a few bf16 steps.
        assert float((flex - dense).norm() / dense.norm()) < 5e-3
        assert float((flex - dense).abs().max()) <= 2**-6 * float(dense.abs().max())


@pytest.mark.gpu
def test_packed_training_step_on_gpu_matches_records_alone() -> None:
    """The decoder on CUDA (flex block mask, bf16 autocast): packed logits equal each record's alone,
    and the masked step runs backward."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    torch.manual_seed(0)
    config = dataclasses.replace(CONFIG, hidden_size=256, ffn_size=256, num_heads=2, num_kv_heads=1, max_seq_len=256)
    model = MoEDecoder(config).cuda()
    window, pieces = packed_window()
    window = window.cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        with torch.no_grad():
            packed = model(window, document_ids(window)).logits[0].float()
            alone = [model(piece.cuda().unsqueeze(0)).logits[0].float() for piece in pieces]
        loss = model(window, document_ids(window)).logits.float().square().mean()
    start = 0
    for piece, logits in zip(pieces, alone):
        stop = start + len(piece)
        torch.testing.assert_close(packed[start:stop], logits, atol=3e-2, rtol=3e-2)
        start = stop
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert model.layers[0].attention.wq.weight.grad.abs().sum() > 0
