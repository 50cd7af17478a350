"""Trunk modules (pairformer stacks, MSA module, template module) equal OSS Boltz-2's, fp32 CPU."""

from __future__ import annotations

import pytest
import torch
from test_model_trunk_support import assert_matches, load_into, random_rotations, randomize_, token_masks

from foldmill.model.layers import PairformerModule, PairformerNoSeqModule
from foldmill.model.msa_module import MSAModule
from foldmill.model.template_module import TemplateV2Module

pytest.importorskip("boltz")
pytestmark = pytest.mark.oracle

from boltz.model.layers import pairformer as oss_pairformer  # noqa: E402
from boltz.model.modules import trunkv2 as oss_trunk  # noqa: E402


def _inputs(batch: int, tokens: int, padding: int, c_s: int, c_z: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(batch, tokens, c_s, generator=g)
    z = torch.randn(batch, tokens, tokens, c_z, generator=g)
    mask, pair_mask = token_masks(batch, tokens, padding)
    return s, z, mask, pair_mask


@torch.no_grad()
@pytest.mark.parametrize(
    ("c_s", "c_z", "heads", "blocks", "tokens"),
    [
        (32, 16, 4, 3, 13),  # small
        (384, 128, 16, 2, 40),  # published widths (token_s 384, token_z 128, 16 heads)
    ],
)
def test_pairformer_module(c_s, c_z, heads, blocks, tokens):
    args = {"num_blocks": blocks, "num_heads": heads, "dropout": 0.0, "activation_checkpointing": False}
    oss = randomize_(oss_pairformer.PairformerModule(c_s, c_z, **args), seed=20)
    ours = load_into(PairformerModule(c_s, c_z, **args), oss)
    s, z, mask, pair_mask = _inputs(1, tokens, 4, c_s, c_z, seed=21)
    z_before = z.clone()
    assert_matches(ours(s, z, mask, pair_mask), oss(s, z, mask, pair_mask, use_kernels=False))
    assert torch.equal(z, z_before)  # blocks after the first add in place, into the stack's own tensor


@torch.no_grad()
def test_pairformer_no_seq_module():
    oss = randomize_(oss_pairformer.PairformerNoSeqModule(16, num_blocks=2, dropout=0.0), seed=22)
    ours = load_into(PairformerNoSeqModule(16, num_blocks=2, dropout=0.0), oss)
    _, z, _, pair_mask = _inputs(2, 12, 3, 8, 16, seed=23)
    assert_matches(ours(z, pair_mask), oss(z, pair_mask, use_kernels=False))


def _msa_features(tokens: int, padding: int, depth: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    token_mask, _ = token_masks(1, tokens, padding)
    msa_mask = token_mask[:, None, :].expand(1, depth, tokens).clone().long()
    msa_mask[:, depth - 2 :] = 0  # padded MSA rows
    deletions = torch.randint(0, 4, (1, depth, tokens), generator=g)
    return {
        "msa": torch.randint(0, 33, (1, depth, tokens), generator=g) * msa_mask,
        "has_deletion": (deletions > 0) & msa_mask.bool(),
        "deletion_value": (2 / torch.pi) * torch.arctan(deletions / 3.0) * msa_mask,
        "msa_paired": (torch.rand(1, depth, tokens, generator=g) < 0.5).float() * msa_mask,
        "msa_mask": msa_mask,
        "token_pad_mask": token_mask,
    }


MSA_ARGS = {
    "msa_s": 16,
    "msa_blocks": 2,
    "msa_dropout": 0.0,
    "z_dropout": 0.0,
    "pairwise_head_width": 8,
    "pairwise_num_heads": 2,
    "activation_checkpointing": False,
}


@torch.no_grad()
@pytest.mark.parametrize(
    ("tokens", "extra"),
    [
        (14, {"use_paired_feature": True}),
        (14, {"use_paired_feature": False}),
        (14, {"subsample_msa": True, "num_subsampled_msa": 4}),
        # Above 384 tokens Boltz-2 chunks every MSA op (and triangle attention by 128 rows).
        (390, {"msa_blocks": 1}),
    ],
)
def test_msa_module(tokens, extra):
    args = {**MSA_ARGS, **extra}
    token_s, token_z = 24, 8
    oss = randomize_(oss_trunk.MSAModule(token_z=token_z, token_s=token_s, **args), seed=24)
    ours = load_into(MSAModule(token_z=token_z, token_s=token_s, **args), oss)
    emb, z, _, _ = _inputs(1, tokens, 3, token_s, token_z, seed=25)
    feats = _msa_features(tokens, 3, depth=7, seed=26)
    torch.manual_seed(0)  # the row subsample is drawn from the global RNG first
    expected = oss(z, emb, feats, use_kernels=False)
    torch.manual_seed(0)
    assert_matches(ours(z, emb, feats), expected)


def _template_features(tokens: int, padding: int, seed: int) -> dict[str, torch.Tensor]:
    """Two templates; the second is absent (all-zero mask), as in a batch padded to 2 templates."""
    g = torch.Generator().manual_seed(seed)
    templates = 2
    token_mask, _ = token_masks(1, tokens, padding)
    present = token_mask[:, None].expand(1, templates, tokens).clone()
    present[:, 1] = 0
    present[:, 0, 2] = 0  # a query residue without template coverage
    res_type = torch.randint(2, 22, (1, templates, tokens), generator=g) * present.long()
    visibility = torch.zeros(1, templates, tokens)
    visibility[:, :, tokens // 2 :] = 1  # two chains placed by different templates
    rotations = random_rotations(templates * tokens, g).reshape(1, templates, tokens, 3, 3)
    ca = 10 * torch.randn(1, templates, tokens, 3, generator=g) * present[..., None]
    return {
        "template_restype": torch.nn.functional.one_hot(res_type, 33),
        "template_frame_rot": rotations,
        "template_frame_t": ca + torch.randn(1, templates, tokens, 3, generator=g),
        "template_cb": ca + 1.5 * torch.randn(1, templates, tokens, 3, generator=g),
        "template_ca": ca,
        "template_mask_cb": present * (torch.rand(1, templates, tokens, generator=g) < 0.9).float(),
        "template_mask_frame": present * (torch.rand(1, templates, tokens, generator=g) < 0.9).float(),
        "template_mask": present,
        "visibility_ids": visibility,
        "asym_id": torch.zeros(1, tokens, dtype=torch.long),
    }


@torch.no_grad()
def test_template_v2_module():
    args = {"template_dim": 16, "template_blocks": 2, "dropout": 0.0, "pairwise_head_width": 8, "pairwise_num_heads": 2}
    oss = randomize_(oss_trunk.TemplateV2Module(24, **args), seed=27)
    ours = load_into(TemplateV2Module(24, **args), oss)
    _, z, _, pair_mask = _inputs(1, 15, 3, 8, 24, seed=28)
    feats = _template_features(15, 3, seed=29)
    assert_matches(ours(z, feats, pair_mask), oss(z, feats, pair_mask, use_kernels=False))

    # Without a present template the update is exactly zero, whatever the weights: the trunk skips it.
    feats["template_mask"] = torch.zeros_like(feats["template_mask"])
    assert torch.equal(ours(z, feats, pair_mask), torch.zeros_like(z))
