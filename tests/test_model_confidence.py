"""The confidence module and every confidence metric equal OSS Boltz-2's (boltz-community), fp32 CPU.

Derived outputs OSS computes outside the module (predict_step's confidence_score, the
writer's chains_ptm) are checked against those formulas applied to OSS's outputs.
"""

from __future__ import annotations

import pytest
import torch
from test_model_trunk_support import assert_matches, complex_features, load_into, predicted_coords, randomize_

from foldmill.model.confidence import ConfidenceModule

pytest.importorskip("boltz")
pytestmark = pytest.mark.oracle

from boltz.model.modules import confidencev2 as oss_confidence  # noqa: E402

TOKEN_S, TOKEN_Z = 32, 16

PUBLISHED_FLAGS = {  # the options the published Boltz-2 confidence module is built with
    "add_s_to_z_prod": True,
    "add_s_input_to_s": True,
    "add_z_input_to_z": True,
    "bond_type_feature": True,
    "fix_sym_check": True,
    "cyclic_pos_enc": True,
    "conditioning_cutoff_min": 4.0,
    "conditioning_cutoff_max": 20.0,
    "confidence_args": {"num_plddt_bins": 50, "num_pde_bins": 64, "num_pae_bins": 64, "use_separate_heads": True},
}
MINIMAL_FLAGS = {"confidence_args": {"use_separate_heads": False}}


def _module_args(flags: dict) -> dict:
    return {
        "pairformer_args": {"num_blocks": 2, "num_heads": 4, "dropout": 0.0, "activation_checkpointing": False},
        "num_dist_bins": 64,
        "max_dist": 22,
        "return_latent_feats": True,
        **flags,
    }


def _modules(flags: dict, seed: int):
    args = _module_args(flags)
    oss = randomize_(oss_confidence.ConfidenceModule(TOKEN_S, TOKEN_Z, **args), seed)
    # OSS returns the (N, N, 64) PAE/PDE logits; foldmill drops them unless asked (they are compared here)
    return oss, load_into(ConfidenceModule(TOKEN_S, TOKEN_Z, **args, return_pair_logits=True), oss)


def _trunk_outputs(tokens: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    s_inputs = torch.randn(1, tokens, TOKEN_S, generator=g)
    s = torch.randn(1, tokens, TOKEN_S, generator=g)
    z = torch.randn(1, tokens, tokens, TOKEN_Z, generator=g)
    distogram = 3 * torch.randn(1, tokens, tokens, 64, generator=g)
    return s_inputs, s, z, distogram


def _expected_derived(oss_out: dict) -> dict:
    """OSS's confidence_score (predict_step) and chains_ptm (writer), from OSS's module outputs."""
    iptm, ptm = oss_out["iptm"], oss_out["ptm"]
    interface = iptm if not torch.allclose(iptm, torch.zeros_like(iptm)) else ptm
    pair_chains = oss_out["pair_chains_iptm"]
    return {
        "confidence_score": (4 * oss_out["complex_plddt"] + interface) / 5,
        "chains_ptm": {chain: pair_chains[chain][chain] for chain in pair_chains},
    }


def _compare(ours_out: dict, oss_out: dict) -> None:
    assert_matches(ours_out, oss_out)
    assert_matches(ours_out, _expected_derived(oss_out))
    # chain keys as OSS writes them into the confidence JSON
    assert list(ours_out["pair_chains_iptm"]) == list(oss_out["pair_chains_iptm"])


@torch.no_grad()
@pytest.mark.parametrize(
    ("flags", "samples", "sequential", "cyclic"),
    [
        (PUBLISHED_FLAGS, 2, True, True),  # as Boltz-2 predicts: samples scored one at a time
        (PUBLISHED_FLAGS, 2, False, False),
        (MINIMAL_FLAGS, 1, False, False),
    ],
)
def test_confidence_module_complex(flags, samples, sequential, cyclic):
    """Two protein chains, a 4-atom ligand (frames rebuilt from the prediction), an ion, padding."""
    oss, ours = _modules(flags, seed=30)
    feats = complex_features(seed=31, cyclic=cyclic)
    tokens = feats["asym_id"].shape[1]
    s_inputs, s, z, distogram = _trunk_outputs(tokens, seed=32)
    x_pred = predicted_coords(feats, samples, seed=33)
    kwargs = {"multiplicity": samples, "run_sequentially": sequential}
    oss_out = oss(s_inputs, s, z, x_pred, feats, distogram, **kwargs)
    ours_out = ours(s_inputs, s, z, x_pred, feats, distogram, **kwargs)
    _compare(ours_out, oss_out)
    # the case must exercise interfaces: nonzero ipTM and a finite interface PAE
    assert (ours_out["iptm"] > 0).all() and torch.isfinite(ours_out["complex_ipae"]).all()


@torch.no_grad()
def test_confidence_module_single_chain():
    """One protein chain: ipTM is 0, so the confidence score falls back to pTM; interface PAE is NaN."""
    oss, ours = _modules(PUBLISHED_FLAGS, seed=34)
    feats = complex_features(seed=35)
    keep = 6  # first 5 residues of chain A + one padding token
    feats = {k: v for k, v in feats.items()}
    for name in (
        "asym_id",
        "entity_id",
        "sym_id",
        "residue_index",
        "token_index",
        "mol_type",
        "token_pad_mask",
        "cyclic_period",
    ):
        feats[name] = feats[name][:, :keep].clone()
    feats["token_pad_mask"][:, 5:] = 0
    feats["asym_id"][:, 5:] = 0
    for name in ("token_bonds", "type_bonds", "contact_conditioning", "contact_threshold"):
        feats[name] = feats[name][:, :keep, :keep]
    feats["atom_to_token"] = feats["atom_to_token"][:, :, :keep] * (torch.arange(64) < 15)[None, :, None]
    feats["atom_pad_mask"] = feats["atom_pad_mask"] * (torch.arange(64) < 15)
    feats["token_to_rep_atom"] = feats["token_to_rep_atom"][:, :keep] * feats["token_pad_mask"][..., None].long()
    feats["frames_idx"] = feats["frames_idx"][:, :, :keep]
    s_inputs, s, z, distogram = _trunk_outputs(keep, seed=36)
    x_pred = predicted_coords(feats, 1, seed=37)
    oss_out = oss(s_inputs, s, z, x_pred, feats, distogram)
    ours_out = ours(s_inputs, s, z, x_pred, feats, distogram)
    _compare(ours_out, oss_out)
    assert torch.all(ours_out["iptm"] == 0)
    assert torch.isnan(ours_out["complex_ipae"]).all()


def test_atom_level_confidence_is_refused():
    with pytest.raises(ValueError, match="token-level"):
        ConfidenceModule(TOKEN_S, TOKEN_Z, {"num_blocks": 1}, token_level_confidence=False)


@torch.no_grad()
def test_batched_records_match_single_records():
    """A batch of two records, two samples each, scores each record as it would alone.

    (Beyond the oracle: OSS assumes one record per batch here.)"""
    _, ours = _modules(PUBLISHED_FLAGS, seed=38)
    records = [complex_features(seed=39), complex_features(seed=40, cyclic=True)]
    tokens = records[0]["asym_id"].shape[1]
    trunk = [_trunk_outputs(tokens, seed=41 + i) for i in range(2)]
    coords = [predicted_coords(records[i], 2, seed=43 + i) for i in range(2)]
    single = [ours(*trunk[i][:3], coords[i], records[i], trunk[i][3], multiplicity=2) for i in range(2)]
    batch_feats = {name: torch.cat([r[name] for r in records]) for name in records[0]}
    batch_trunk = [torch.cat([t[k] for t in trunk]) for k in range(4)]
    batched = ours(*batch_trunk[:3], torch.cat(coords), batch_feats, batch_trunk[3], multiplicity=2)
    for name in ("plddt", "pae", "pde", "ptm", "iptm", "complex_plddt", "complex_iplddt", "complex_pde", "complex_pae"):
        assert_matches(batched[name], torch.cat([out[name] for out in single]), where=name)
    for chain in single[0]["chains_ptm"]:
        assert_matches(batched["chains_ptm"][chain], torch.cat([out["chains_ptm"][chain] for out in single]))


@torch.no_grad()
def test_pair_logits_are_dropped_unless_asked():
    """By default the (N, N, 64) PAE/PDE logits are read by the metrics and dropped; PAE/PDE stay."""
    oss, kept = _modules(PUBLISHED_FLAGS, seed=30)
    dropped = ConfidenceModule(TOKEN_S, TOKEN_Z, **{**_module_args(PUBLISHED_FLAGS), "return_pair_logits": False})
    dropped.load_state_dict(kept.state_dict())
    feats = complex_features(seed=31)
    s_inputs, s, z, distogram = _trunk_outputs(feats["asym_id"].shape[1], seed=32)
    x_pred = predicted_coords(feats, 2, seed=33)
    with_logits = kept(s_inputs, s, z, x_pred, feats, distogram, multiplicity=2)
    without = dropped(s_inputs, s, z, x_pred, feats, distogram, multiplicity=2)
    assert "pae_logits" in with_logits and "pae_logits" not in without and "pde_logits" not in without
    torch.testing.assert_close(without["pae"], with_logits["pae"], rtol=0, atol=0)
