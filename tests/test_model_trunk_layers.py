"""Each trunk layer equals OSS Boltz-2's (boltz-community) with the same weights and inputs, fp32 CPU."""

from __future__ import annotations

import pytest
import torch
from test_model_trunk_support import assert_matches, complex_features, load_into, randomize_, token_masks

from foldmill.model.contact_conditioning import ContactConditioning
from foldmill.model.heads import BFactorModule, DistogramModule
from foldmill.model.layers import (
    AttentionPairBias,
    FourierEmbedding,
    OuterProductMean,
    PairformerLayer,
    PairformerNoSeqLayer,
    PairWeightedAveraging,
    Transition,
    TriangleAttentionEndingNode,
    TriangleAttentionStartingNode,
    TriangleMultiplicationIncoming,
    TriangleMultiplicationOutgoing,
    triangle_attention,
    triangle_multiplication,
)
from foldmill.model.relative_position import RelativePositionEncoder

pytest.importorskip("boltz")
pytestmark = pytest.mark.oracle

from boltz.model.layers import attentionv2 as oss_attention  # noqa: E402
from boltz.model.layers import outer_product_mean as oss_opm  # noqa: E402
from boltz.model.layers import pair_averaging as oss_pwa  # noqa: E402
from boltz.model.layers import pairformer as oss_pairformer  # noqa: E402
from boltz.model.layers import transition as oss_transition  # noqa: E402
from boltz.model.layers import triangular_mult as oss_trimul  # noqa: E402
from boltz.model.layers.triangular_attention import attention as oss_triatt  # noqa: E402
from boltz.model.modules import encodersv2 as oss_encoders  # noqa: E402
from boltz.model.modules import trunkv2 as oss_trunk  # noqa: E402

B, N, PAD = 2, 11, 3  # batch, tokens, padded tokens per item
C_S, C_Z = 32, 16


def _pair(seed: int, channels: int = C_Z) -> torch.Tensor:
    return torch.randn(B, N, N, channels, generator=torch.Generator().manual_seed(seed))


def _pair_oracle(oss_module, ours_module, seed=0):
    oss_module = randomize_(oss_module, seed)
    return oss_module, load_into(ours_module, oss_module)


@torch.no_grad()
@pytest.mark.parametrize("chunk_size", [None, 24])
def test_transition(chunk_size):
    oss, ours = _pair_oracle(oss_transition.Transition(C_Z, 4 * C_Z), Transition(C_Z, 4 * C_Z))
    x = _pair(1)
    assert_matches(ours(x, chunk_size), oss(x, chunk_size))


@torch.no_grad()
@pytest.mark.parametrize(
    ("oss_cls", "ours_cls"),
    [
        (oss_trimul.TriangleMultiplicationOutgoing, TriangleMultiplicationOutgoing),
        (oss_trimul.TriangleMultiplicationIncoming, TriangleMultiplicationIncoming),
    ],
)
@pytest.mark.parametrize("row_blocks", [False, True])
def test_triangle_multiplication(oss_cls, ours_cls, row_blocks, monkeypatch):
    if row_blocks:  # the large-input path: edges by blocks of 4 rows, one matrix product per channel
        monkeypatch.setattr(triangle_multiplication, "ROW_BLOCKED_TOKENS", 0)
        monkeypatch.setattr(triangle_multiplication, "ROW_BLOCK_PAIRS", 4 * N)
    oss, ours = _pair_oracle(oss_cls(C_Z), ours_cls(C_Z))
    x = _pair(2)
    _, pair_mask = token_masks(B, N, PAD)
    assert_matches(ours(x, pair_mask), oss(x, mask=pair_mask, use_kernels=False))


@torch.no_grad()
@pytest.mark.parametrize(
    ("oss_cls", "ours_cls"),
    [
        (oss_triatt.TriangleAttentionStartingNode, TriangleAttentionStartingNode),
        (oss_triatt.TriangleAttentionEndingNode, TriangleAttentionEndingNode),
    ],
)
@pytest.mark.parametrize("chunk_size", [None, 4])
@pytest.mark.parametrize("row_blocks", [False, True])
@pytest.mark.parametrize("residual", [None, "in_place", "fresh"])
def test_triangle_attention(oss_cls, ours_cls, chunk_size, row_blocks, residual, monkeypatch):
    """The update, or with residual_out x + update written there (x's own storage or another tensor),
    each output-projection block accumulating into its rows (of the pair, or of its transpose)."""
    if row_blocks:  # the large-input path: q/k/v/g projected one row at a time
        monkeypatch.setattr(triangle_attention, "PROJECTION_BLOCK_BYTES", 1)
    oss, ours = _pair_oracle(oss_cls(C_Z, 8, 2, inf=1e9), ours_cls(C_Z, 8, 2))
    x = _pair(3)
    _, pair_mask = token_masks(B, N, PAD)
    expected = oss(x, mask=pair_mask, chunk_size=chunk_size, use_kernels=False)
    if residual is None:
        assert_matches(ours(x, pair_mask, chunk_size), expected)
        return
    out = x.clone() if residual == "in_place" else torch.empty_like(x)
    given = x if residual == "fresh" else out
    assert ours(given, pair_mask, chunk_size, residual_out=out) is out
    assert_matches(out, x + expected)


@torch.no_grad()
def test_attention_pair_bias():
    oss, ours = _pair_oracle(oss_attention.AttentionPairBias(C_S, C_Z, 4), AttentionPairBias(C_S, C_Z, 4))
    g = torch.Generator().manual_seed(4)
    s, k_in = torch.randn(B, N, C_S, generator=g), torch.randn(B, N, C_S, generator=g)
    mask, _ = token_masks(B, N, PAD)
    assert_matches(ours(s, _pair(5), mask, k_in), oss(s, _pair(5), mask, k_in))


@torch.no_grad()
def test_attention_precomputed_bias_with_multiplicity():
    """The diffusion transformer's use: bias given per head, shared by stacked samples."""
    heads, multiplicity = 4, 3
    oss, ours = _pair_oracle(
        oss_attention.AttentionPairBias(C_S, num_heads=heads, compute_pair_bias=False),
        AttentionPairBias(C_S, num_heads=heads, compute_pair_bias=False),
    )
    g = torch.Generator().manual_seed(6)
    s = torch.randn(B * multiplicity, N, C_S, generator=g)
    bias = torch.randn(B, N, N, heads, generator=g)
    mask = token_masks(B * multiplicity, N, PAD)[0]
    assert_matches(ours(s, bias, mask, s, multiplicity), oss(s, bias, mask, s, multiplicity=multiplicity))


def _msa(seed: int, depth: int = 6, channels: int = C_S):
    g = torch.Generator().manual_seed(seed)
    m = torch.randn(B, depth, N, channels, generator=g)
    msa_mask = torch.ones(B, depth, N)
    msa_mask[:, :, N - PAD :] = 0
    msa_mask[0, depth - 2 :] = 0  # padded MSA rows
    return m, msa_mask


@torch.no_grad()
@pytest.mark.parametrize("oss_chunk_size, token_rows", [(None, None), (3, 2)])
def test_outer_product_mean(oss_chunk_size, token_rows):
    """Unchunked, and by token rows against OSS's channel chunks (the same sums, reordered)."""
    oss, ours = _pair_oracle(oss_opm.OuterProductMean(C_S, 8, C_Z), OuterProductMean(C_S, 8, C_Z))
    m, msa_mask = _msa(7)
    assert_matches(ours(m, msa_mask, token_rows), oss(m, msa_mask, oss_chunk_size))


@torch.no_grad()
@pytest.mark.parametrize("chunk_heads", [False, True])
def test_pair_weighted_averaging(chunk_heads):
    oss, ours = _pair_oracle(oss_pwa.PairWeightedAveraging(C_S, C_Z, 8, 4), PairWeightedAveraging(C_S, C_Z, 8, 4))
    m, _ = _msa(8)
    _, pair_mask = token_masks(B, N, PAD)
    assert_matches(ours(m, _pair(9), pair_mask, chunk_heads), oss(m, _pair(9), pair_mask, chunk_heads))


@torch.no_grad()
@pytest.mark.parametrize("post_layer_norm", [False, True])
def test_pairformer_layer(post_layer_norm):
    oss, ours = _pair_oracle(
        oss_pairformer.PairformerLayer(C_S, C_Z, 4, 0.25, 8, 2, post_layer_norm),
        PairformerLayer(C_S, C_Z, 4, 8, 2, post_layer_norm),
    )
    s = torch.randn(B, N, C_S, generator=torch.Generator().manual_seed(10))
    mask, pair_mask = token_masks(B, N, PAD)
    assert_matches(ours(s, _pair(11), mask, pair_mask, 5), oss(s, _pair(11), mask, pair_mask, 5))


@torch.no_grad()
def test_pairformer_no_seq_layer():
    oss, ours = _pair_oracle(oss_pairformer.PairformerNoSeqLayer(C_Z, 0.25, 8, 2), PairformerNoSeqLayer(C_Z, 8, 2))
    _, pair_mask = token_masks(B, N, PAD)
    assert_matches(ours(_pair(12), pair_mask), oss(_pair(12), pair_mask))


@torch.no_grad()
@pytest.mark.parametrize(("fix_sym_check", "cyclic"), [(False, False), (True, True), (True, False)])
def test_relative_position(fix_sym_check, cyclic):
    oss, ours = _pair_oracle(
        oss_encoders.RelativePositionEncoder(C_Z, fix_sym_check=fix_sym_check, cyclic_pos_enc=cyclic),
        RelativePositionEncoder(C_Z, fix_sym_check=fix_sym_check, cyclic_pos_enc=cyclic),
    )
    feats = complex_features(cyclic=cyclic)
    assert_matches(ours(feats), oss(feats))


@torch.no_grad()
def test_contact_conditioning():
    oss, ours = _pair_oracle(oss_trunk.ContactConditioning(C_Z, 4.0, 20.0), ContactConditioning(C_Z, 4.0, 20.0))
    feats = complex_features()
    assert_matches(ours(feats), oss(feats))


@torch.no_grad()
def test_fourier_embedding():
    oss, ours = _pair_oracle(oss_encoders.FourierEmbedding(C_Z), FourierEmbedding(C_Z))
    times = torch.rand(7, generator=torch.Generator().manual_seed(13))
    assert_matches(ours(times), oss(times))


@torch.no_grad()
def test_distogram_and_bfactor_heads():
    oss_disto, ours_disto = _pair_oracle(oss_trunk.DistogramModule(C_Z, 64), DistogramModule(C_Z, 64))
    assert_matches(ours_disto(_pair(14)), oss_disto(_pair(14)))
    oss_bf, ours_bf = _pair_oracle(oss_trunk.BFactorModule(C_S, 64), BFactorModule(C_S, 64))
    s = torch.randn(B, N, C_S, generator=torch.Generator().manual_seed(15))
    assert_matches(ours_bf(s), oss_bf(s))


def test_triangle_attention_projects_all_rows_at_once_below_about_700_tokens():
    """One projection for the whole pair at small sizes; above, blocks of rows within 512 MiB."""
    assert triangle_attention.projection_block_rows(1, 700, 512, 2) >= 700
    assert triangle_attention.projection_block_rows(1, 1000, 512, 2) == 524
    assert triangle_attention.projection_block_rows(1, 6000, 512, 2) == 87
