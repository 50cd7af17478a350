"""OSS Boltz-2 (the `boltz` / boltz-community package) built as the baseline of `foldmill bench forward`.

- `oss_hyperparameters(config)`: keyword arguments of OSS `Boltz2(...)` for a foldmill
  Boltz2Config with Boltz-2's released flags (v2 pairformer, templates v2, bond types, B-factor,
  cyclic positions, symmetric-chain fix).
- `oss_boltz2(config, seed, device)`: that OSS model with foldmill's seeded random weights
  (`randomize_weights`; every layer passes signal on, unlike a training initialisation), in eval
  mode, its cuEquivariance kernels on when `use_kernels` (as `boltz predict` runs on a GPU).
- `compile_like_oss(model)`: what OSS's compile_* flags do (torch.compile of the template, MSA,
  pairformer and score modules, dynamic=False); note OSS's forward bypasses the first three at
  inference (it calls their `_orig_mod`), so in effect the score model is compiled.
- `oss_predict(model, feats, ...)`: a forward as `boltz predict` makes it (bf16 autocast,
  inference mode, confidence run sequentially).
"""

from __future__ import annotations

from typing import Any
from unittest import mock

import torch
from torch import Tensor

from foldmill.model.config import Boltz2Config
from foldmill.model.demo import randomize_weights


def oss_hyperparameters(config: Boltz2Config, use_kernels: bool = False) -> dict[str, Any]:
    c = config
    pairwise = {"pairwise_head_width": c.pairwise_head_width, "pairwise_num_heads": c.pairwise_num_heads}
    return {
        "atom_s": c.atom_s,
        "atom_z": c.atom_z,
        "token_s": c.token_s,
        "token_z": c.token_z,
        "num_bins": c.num_bins,
        "atom_feature_dim": c.atom_feature_dim,
        "atoms_per_window_queries": c.atoms_per_window_queries,
        "atoms_per_window_keys": c.atoms_per_window_keys,
        "training_args": {},
        "validation_args": {},
        "diffusion_loss_args": {},
        "embedder_args": {
            "atom_encoder_depth": c.embedder_atom_encoder_depth,
            "atom_encoder_heads": c.embedder_atom_encoder_heads,
            "add_mol_type_feat": True,
            "add_method_conditioning": True,
            "add_modified_flag": True,
            "add_cyclic_flag": True,
        },
        "msa_args": {
            "msa_s": c.msa_s,
            "msa_blocks": c.msa_blocks,
            "msa_dropout": 0.0,
            "z_dropout": 0.0,
            "pairwise_head_width": c.msa_pairwise_head_width,
            "pairwise_num_heads": c.msa_pairwise_num_heads,
            "use_paired_feature": c.msa_use_paired_feature,
        },
        "pairformer_args": dict(
            num_blocks=c.pairformer_blocks, num_heads=c.pairformer_heads, dropout=0.0, v2=True, **pairwise
        ),
        "template_args": dict(template_dim=c.template_dim, template_blocks=c.template_blocks, **pairwise),
        "score_model_args": {
            "sigma_data": c.sigma_data,
            "dim_fourier": c.dim_fourier,
            "atom_encoder_depth": c.diffusion_atom_encoder_depth,
            "atom_encoder_heads": c.diffusion_atom_encoder_heads,
            "token_transformer_depth": c.token_transformer_depth,
            "token_transformer_heads": c.token_transformer_heads,
            "atom_decoder_depth": c.atom_decoder_depth,
            "atom_decoder_heads": c.atom_decoder_heads,
            "conditioning_transition_layers": c.conditioning_transition_layers,
        },
        "diffusion_process_args": {
            "sigma_min": c.sigma_min,
            "sigma_max": c.sigma_max,
            "sigma_data": c.sigma_data,
            "rho": c.rho,
            "gamma_0": c.gamma_0,
            "gamma_min": c.gamma_min,
            "noise_scale": c.noise_scale,
            "step_scale": c.step_scale,
            "alignment_reverse_diff": c.alignment_reverse_diff,
        },
        "confidence_model_args": {
            "pairformer_args": dict(
                num_blocks=c.confidence_pairformer_blocks,
                num_heads=c.confidence_pairformer_heads,
                dropout=0.0,
                v2=True,
                **pairwise,
            ),
            "num_dist_bins": c.confidence_num_dist_bins,
            "max_dist": c.confidence_max_dist,
            "add_s_to_z_prod": True,
            "add_s_input_to_s": True,
            "add_z_input_to_z": True,
            "confidence_args": {
                "num_plddt_bins": c.num_plddt_bins,
                "num_pde_bins": c.num_pde_bins,
                "num_pae_bins": c.num_pae_bins,
                "use_separate_heads": c.confidence_separate_heads,
            },
        },
        "conditioning_cutoff_min": c.conditioning_cutoff_min,
        "conditioning_cutoff_max": c.conditioning_cutoff_max,
        "validate_structure": False,
        "fix_sym_check": True,
        "cyclic_pos_enc": True,
        "bond_type_feature": True,
        "use_templates": c.use_templates,
        "use_templates_v2": True,
        "predict_bfactor": c.predict_bfactor,
        "alpha_pae": 1.0,
        "use_kernels": use_kernels,
    }


def oss_boltz2(
    config: Boltz2Config, seed: int = 0, device: str | torch.device = "cpu", use_kernels: bool = False
) -> Any:
    """OSS Boltz2 in eval mode with foldmill's seeded random weights, on `device`."""
    from boltz.model.layers import initialize
    from boltz.model.models.boltz2 import Boltz2 as OssBoltz2

    # OSS draws its initial weights with scipy's truncated normal on the CPU (minutes for 507M
    # parameters); they are overwritten below, so skip that draw.
    with torch.device(device), mock.patch.object(initialize, "trunc_normal_init_", lambda *args, **kwargs: None):
        model = OssBoltz2(**oss_hyperparameters(config, use_kernels))
    randomize_weights(model, seed)
    return model.eval()


def compile_like_oss(model: Any) -> Any:
    """Apply OSS's compile_templates/msa/pairformer/structure flags to a built OSS model, in place."""
    options = {"dynamic": False, "fullgraph": False}
    if model.use_templates:
        model.template_module = torch.compile(model.template_module, **options)
        model.is_template_compiled = True
    model.msa_module = torch.compile(model.msa_module, **options)
    model.is_msa_compiled = True
    model.pairformer_module = torch.compile(model.pairformer_module, **options)
    model.is_pairformer_compiled = True
    model.structure_module.score_model = torch.compile(model.structure_module.score_model, **options)
    return model


def oss_predict(
    model: Any,
    feats: dict[str, Tensor],
    recycling_steps: int,
    sampling_steps: int,
    diffusion_samples: int,
    max_parallel_samples: int,
    seed: int,
    autocast: bool = True,
) -> dict[str, Any]:
    """One OSS forward as `boltz predict` runs it (bf16 autocast on CUDA, inference mode)."""
    torch.manual_seed(seed)
    device_type = feats["token_pad_mask"].device.type
    with torch.inference_mode(), torch.autocast(device_type, dtype=torch.bfloat16, enabled=autocast):
        return model(
            dict(feats),
            recycling_steps=recycling_steps,
            num_sampling_steps=sampling_steps,
            diffusion_samples=diffusion_samples,
            max_parallel_samples=max_parallel_samples,
            run_confidence_sequentially=True,
        )
