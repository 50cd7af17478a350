"""Plain configuration of the Boltz-2-compatible model and of one inference run.

`Boltz2Config` holds the architecture hyperparameters. Its defaults are those of the
published `boltz2_conf.ckpt` (token_s 384, token_z 128, atom_s 128, atom_z 16, 64 pairformer
blocks, 24-layer diffusion transformer with 16 heads, 8-block confidence stack);
`Boltz2Config.small()` is a fast configuration for tests. Sizes that shape parameters can
also be read back from a state_dict (`foldmill.model.checkpoint.config_from_state_dict`).

`InferenceRecipe` is what a caller chooses per run: recycles, sampling steps, samples, the
cap on samples denoised at once, and the seed of the sampler's random stream.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from foldmill.errors import FoldmillError


@dataclass(frozen=True)
class Boltz2Config:
    """Architecture of the model. Field names follow Boltz-2's hyperparameters where it has one."""

    # Widths
    token_s: int = 384
    token_z: int = 128
    atom_s: int = 128
    atom_z: int = 16
    atom_feature_dim: int = 388  # ref_pos 3 + charge 1 + element 128 + atom-name characters 4 x 64
    atoms_per_window_queries: int = 32
    atoms_per_window_keys: int = 128
    num_bins: int = 64  # distogram and B-factor bins

    # Input embedder's atom attention
    embedder_atom_encoder_depth: int = 3
    embedder_atom_encoder_heads: int = 4

    # Pair initialisation
    conditioning_cutoff_min: float = 4.0
    conditioning_cutoff_max: float = 20.0

    # Template module (v2)
    use_templates: bool = True
    template_dim: int = 64
    template_blocks: int = 2

    # MSA module
    msa_s: int = 64
    msa_blocks: int = 4
    msa_pairwise_head_width: int = 32
    msa_pairwise_num_heads: int = 4
    msa_use_paired_feature: bool = True

    # Pairformer trunk
    pairformer_blocks: int = 64
    pairformer_heads: int = 16
    pairwise_head_width: int = 32
    pairwise_num_heads: int = 4

    # Score model (DiffusionModule)
    dim_fourier: int = 256
    diffusion_atom_encoder_depth: int = 3
    diffusion_atom_encoder_heads: int = 4
    token_transformer_depth: int = 24
    token_transformer_heads: int = 16
    atom_decoder_depth: int = 3
    atom_decoder_heads: int = 4
    conditioning_transition_layers: int = 2

    # EDM sampler (Boltz-2's inference values)
    sigma_min: float = 0.0001
    sigma_max: float = 160.0
    sigma_data: float = 16.0
    rho: float = 7.0
    gamma_0: float = 0.8
    gamma_min: float = 1.0
    noise_scale: float = 1.003
    step_scale: float = 1.5
    alignment_reverse_diff: bool = True  # align the noisy sample onto the denoised one each step

    # B-factor head
    predict_bfactor: bool = True

    # Confidence module
    confidence_pairformer_blocks: int = 8
    confidence_pairformer_heads: int = 16
    confidence_num_dist_bins: int = 64
    confidence_max_dist: float = 22.0
    num_plddt_bins: int = 50
    num_pde_bins: int = 64
    num_pae_bins: int = 64
    confidence_separate_heads: bool = True  # intra-/inter-chain PAE and PDE heads

    @classmethod
    def small(cls, **overrides: Any) -> Boltz2Config:
        """A narrow, shallow configuration for tests and demos (seconds on a CPU)."""
        small = dict(
            token_s=64,
            token_z=32,
            atom_s=32,
            atom_z=8,
            embedder_atom_encoder_depth=2,
            embedder_atom_encoder_heads=2,
            template_dim=16,
            template_blocks=1,
            msa_s=16,
            msa_blocks=1,
            msa_pairwise_head_width=8,
            msa_pairwise_num_heads=2,
            pairformer_blocks=2,
            pairformer_heads=4,
            pairwise_head_width=8,
            pairwise_num_heads=2,
            dim_fourier=32,
            diffusion_atom_encoder_depth=2,
            diffusion_atom_encoder_heads=2,
            token_transformer_depth=2,
            token_transformer_heads=4,
            atom_decoder_depth=2,
            atom_decoder_heads=2,
            conditioning_transition_layers=1,
            confidence_pairformer_blocks=1,
            confidence_pairformer_heads=4,
        )
        small.update(overrides)
        return cls(**small)

    def replace(self, **changes: Any) -> Boltz2Config:
        """A copy with some fields changed."""
        return replace(self, **changes)

    # Keyword arguments of the sub-modules, in the shape Boltz-2's hyperparameter dicts have.

    def pairformer_args(self) -> dict[str, Any]:
        return {
            "num_blocks": self.pairformer_blocks,
            "num_heads": self.pairformer_heads,
            "pairwise_head_width": self.pairwise_head_width,
            "pairwise_num_heads": self.pairwise_num_heads,
        }

    def msa_args(self) -> dict[str, Any]:
        return {
            "msa_s": self.msa_s,
            "msa_blocks": self.msa_blocks,
            "pairwise_head_width": self.msa_pairwise_head_width,
            "pairwise_num_heads": self.msa_pairwise_num_heads,
            "use_paired_feature": self.msa_use_paired_feature,
        }

    def template_args(self) -> dict[str, Any]:
        return {
            "template_dim": self.template_dim,
            "template_blocks": self.template_blocks,
            "pairwise_head_width": self.pairwise_head_width,
            "pairwise_num_heads": self.pairwise_num_heads,
        }

    def confidence_pairformer_args(self) -> dict[str, Any]:
        return {
            "num_blocks": self.confidence_pairformer_blocks,
            "num_heads": self.confidence_pairformer_heads,
            "pairwise_head_width": self.pairwise_head_width,
            "pairwise_num_heads": self.pairwise_num_heads,
        }


@dataclass(frozen=True)
class InferenceRecipe:
    """Per-run inference settings (Boltz-2 CLI defaults).

    max_parallel_samples caps how many diffusion samples go through the score model and the
    confidence module at once (peak memory); it never changes the results' meaning.
    seed seeds the sampler's own torch.Generator; None draws a fresh seed.
    """

    recycling_steps: int = 3
    sampling_steps: int = 200
    diffusion_samples: int = 1
    max_parallel_samples: int = 5
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.recycling_steps < 0:
            raise FoldmillError(f"recycling_steps must be >= 0, got {self.recycling_steps}")
        if self.sampling_steps < 2:
            raise FoldmillError(
                f"sampling_steps must be >= 2 (the noise schedule needs two ends), got {self.sampling_steps}"
            )
        if self.diffusion_samples < 1:
            raise FoldmillError(f"diffusion_samples must be >= 1, got {self.diffusion_samples}")
        if self.max_parallel_samples < 1:
            raise FoldmillError(f"max_parallel_samples must be >= 1, got {self.max_parallel_samples}")
