"""foldmill's Boltz2 against OSS Boltz-2 (boltz-community) on the issue's cases.

Both models hold the same seeded random weights (OSS state_dict loaded strict=True into
ours) and read the same OSS-featurised inputs; everything runs on CPU in fp32 with OSS
kernels off. Per case:
- trunk: s, z and the distogram, relative error <= 1e-5;
- diffusion: from OSS's trunk outputs, the full sampler with the same seed (OSS's global
  RNG reseeded at sampling; its trunk draws unused dropout masks from it), coordinates
  <= 1e-4 A max deviation;
- confidence: from OSS's coordinates, pLDDT, PAE, PDE, pTM, ipTM and summaries <= 1e-5 relative;
- end to end: `predict` against OSS's forward (coordinates within 1e-4 of their scale, as
  trunk differences are amplified by the sampler).
Relative error = max |ours - oss| / max |oss|.
"""

from __future__ import annotations

import pytest
import torch

import oss_oracle
from oss_oracle import one_torch_thread, oracle_features  # noqa: F401 - fixtures
from foldmill.model import Boltz2, Boltz2Config, InferenceRecipe
from foldmill.model.boltz2 import CONFIDENCE_SCALARS, TrunkOutput

pytestmark = [pytest.mark.oracle, pytest.mark.usefixtures("one_torch_thread")]

SEED = 11
RECIPE = InferenceRecipe(recycling_steps=1, sampling_steps=4, diffusion_samples=2, max_parallel_samples=1, seed=SEED)
SMALL = Boltz2Config.small()
# Published widths and head counts, one block/layer of everything.
FULL_WIDTH = Boltz2Config(
    embedder_atom_encoder_depth=1,
    template_blocks=1,
    msa_blocks=1,
    pairformer_blocks=1,
    diffusion_atom_encoder_depth=1,
    token_transformer_depth=1,
    atom_decoder_depth=1,
    conditioning_transition_layers=1,
    confidence_pairformer_blocks=1,
)
REL_TOL = 1e-5
COORD_TOL = 1e-4  # A


def relative_error(ours: torch.Tensor, oss: torch.Tensor) -> float:
    scale = oss.abs().max().clamp(min=1e-12)
    return float((ours.double() - oss.double()).abs().max() / scale)


def with_deletions(feats: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """OSS zeroes deletion features (a known OSS bug); give the model non-zero ones to compare."""
    generator = torch.Generator().manual_seed(0)
    has_deletion = torch.rand(feats["msa"].shape, generator=generator) < 0.3
    feats["has_deletion"] = has_deletion
    feats["deletion_value"] = has_deletion * torch.rand(feats["msa"].shape, generator=generator)
    feats["deletion_mean"] = torch.rand(feats["deletion_mean"].shape, generator=generator)
    return feats


def model_pair(config: Boltz2Config):
    oss = oss_oracle.oss_model(config, seed=SEED)
    ours = Boltz2(config)
    ours.load_state_dict(oss.state_dict(), strict=True)
    return oss, ours.eval()


@pytest.fixture(scope="module")
def small_models():
    return model_pair(SMALL)


def run_oss(oss, feats: dict[str, torch.Tensor], recipe: InferenceRecipe) -> dict:
    """OSS forward; its sampler starts from torch.manual_seed(recipe.seed), as ours starts from its generator."""
    sample = oss.structure_module.sample

    def reseeded_sample(*args, **kwargs):
        torch.manual_seed(recipe.seed)
        return sample(*args, **kwargs)

    oss.structure_module.sample = reseeded_sample
    try:
        with torch.no_grad():
            return oss(
                dict(feats),
                recycling_steps=recipe.recycling_steps,
                num_sampling_steps=recipe.sampling_steps,
                diffusion_samples=recipe.diffusion_samples,
                max_parallel_samples=recipe.max_parallel_samples,
                run_confidence_sequentially=True,
            )
    finally:
        oss.structure_module.sample = sample


def check_against_oss(oss, ours: Boltz2, feats: dict[str, torch.Tensor], recipe: InferenceRecipe) -> dict[str, float]:
    """All comparisons of the module docstring; returns the achieved errors by output."""
    reference = run_oss(oss, feats, recipe)
    errors: dict[str, float] = {}
    with torch.no_grad():
        # Trunk
        trunk = ours.trunk(dict(feats), recipe.recycling_steps)
        errors["s"] = relative_error(trunk.s, reference["s"])
        errors["z"] = relative_error(trunk.z, reference["z"])
        errors["pdistogram"] = relative_error(ours.distogram_module(trunk.z), reference["pdistogram"])

        # Diffusion from OSS's trunk outputs
        oss_trunk = TrunkOutput(
            s_inputs=oss.input_embedder(dict(feats)), s=reference["s"], z=reference["z"],
            relative_position_encoding=oss.rel_pos(feats),
        )
        conditioning = ours.diffusion_conditioning(
            oss_trunk.s, oss_trunk.z, oss_trunk.relative_position_encoding, feats
        )
        coords = ours.structure_module.sample(
            s_trunk=oss_trunk.s,
            s_inputs=oss_trunk.s_inputs,
            feats=feats,
            conditioning=conditioning,
            num_sampling_steps=recipe.sampling_steps,
            multiplicity=recipe.diffusion_samples,
            max_parallel_samples=recipe.max_parallel_samples,
            generator=torch.Generator().manual_seed(recipe.seed),
        )
        errors["coords_A"] = float((coords - reference["sample_atom_coords"]).abs().max())

        # Confidence from OSS's structures
        confidence = ours.confidence(
            oss_trunk, reference["sample_atom_coords"], reference["pdistogram"], feats, recipe
        )
        for name in ("plddt", "pae", "pde", *CONFIDENCE_SCALARS):
            if name in reference:  # OSS computes confidence_score outside forward()
                errors[name] = relative_error(confidence[name], reference[name])
        oss_pairs = reference["pair_chains_iptm"]
        for i, by_chain in oss_pairs.items():
            for j, values in by_chain.items():
                errors[f"pair_chains_iptm[{i},{j}]"] = relative_error(confidence["pair_chains_iptm"][:, i, j], values)

    assert max(errors[k] for k in ("s", "z", "pdistogram")) <= REL_TOL, errors
    assert errors["coords_A"] <= COORD_TOL, errors
    confidence_errors = {k: v for k, v in errors.items() if k not in ("s", "z", "pdistogram", "coords_A")}
    assert max(confidence_errors.values()) <= REL_TOL, confidence_errors
    assert torch.equal(confidence["chains_ptm"], torch.diagonal(confidence["pair_chains_iptm"], dim1=1, dim2=2))
    return errors


@pytest.mark.parametrize("case", oss_oracle.ORACLE_CASES)
def test_small_config_matches_oss(case, oracle_features, small_models):
    feats = oracle_features(case)
    if case == "monomer_msa":
        feats = with_deletions(feats)
    check_against_oss(*small_models, feats, RECIPE)


def test_full_width_config_matches_oss(oracle_features):
    """Published widths and head counts (token_s 384, token_z 128, 16 heads, ...), one block each."""
    oss, ours = model_pair(FULL_WIDTH)
    check_against_oss(oss, ours, oracle_features("protein_ligand"), RECIPE)


def test_predict_end_to_end_matches_oss(oracle_features, small_models):
    """The whole predict() against OSS's forward, with a three-sample cap of two in parallel."""
    oss, ours = small_models
    feats = oracle_features("dimer_paired_msa")
    recipe = InferenceRecipe(recycling_steps=2, sampling_steps=5, diffusion_samples=3, max_parallel_samples=2, seed=5)
    reference = run_oss(oss, feats, recipe)
    out = ours.predict(dict(feats), recipe)

    coords, oss_coords = out["sample_atom_coords"], reference["sample_atom_coords"]
    assert coords.shape == oss_coords.shape == (3, feats["atom_pad_mask"].shape[1], 3)
    assert relative_error(coords, oss_coords) <= 1e-4
    for name in ("s", "z", "pdistogram", "plddt", "pae", "pde", "ptm", "iptm", "complex_plddt", "complex_pde"):
        assert relative_error(out[name], reference[name]) <= 1e-4, name
    num_tokens = feats["token_pad_mask"].shape[1]
    assert out["plddt"].shape == (3, num_tokens)
    assert out["pae"].shape == out["pde"].shape == (3, num_tokens, num_tokens)
    assert out["pair_chains_iptm"].shape == (3, 2, 2) and out["chains_ptm"].shape == (3, 2)
    for name in CONFIDENCE_SCALARS:
        assert out[name].shape == (3,), name
