"""Diffusion conditioning: everything the score model needs that does not depend on the noise.

Computed once per prediction, outside the sampling loop, from the trunk's s (B, T, token_s),
z (B, T, T, token_z) and the relative position encoding (B, T, T, token_z):
- q, c: atom single features (B, N, atom_s), c conditioned on s;
- atom_enc_bias / atom_dec_bias: per-layer attention biases of the atom encoder / decoder,
  (B, N/W, W, H, depth*heads), from the windowed atom-pair features;
- token_trans_bias: per-layer biases of the token transformer (B, T, T, depth*heads), stored
  layer-major (each layer's (H, T, T) block contiguous; see `token_transformer_bias`).
Parameter names match the Boltz-2 checkpoint (`diffusion_conditioning.*`).

The pair computations (pairwise conditioning, the token transformer's bias) act on each token
pair alone, so they run a block of token rows at a time (foldmill.kernels.token_rows) and write
into one preallocated output in the compute dtype: at 6,000 tokens the unblocked concatenation,
transitions and 24 per-layer projections held ~80 GiB of temporaries; a block holds < 1 GiB.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from foldmill.kernels.token_rows import by_token_rows, rows_per_block
from foldmill.model.atom_attention import AtomEncoder
from foldmill.model.config import Boltz2Config
from foldmill.model.layers.layer_norm import LayerNorm
from foldmill.model.layers.transition import Transition


@dataclass
class DiffusionConditioningOutput:
    """Noise-independent inputs of the score model (shapes in the module docstring)."""

    q: Tensor
    c: Tensor
    atom_enc_bias: Tensor
    atom_dec_bias: Tensor
    token_trans_bias: Tensor


class PairwiseConditioning(nn.Module):
    """z_trunk and the relative position encoding -> conditioned pair features (B, T, T, token_z)."""

    def __init__(self, token_z: int, dim_token_rel_pos_feats: int, num_transitions: int = 2) -> None:
        super().__init__()
        width = token_z + dim_token_rel_pos_feats
        self.dim_pairwise_init_proj = nn.Sequential(LayerNorm(width), nn.Linear(width, token_z, bias=False))
        self.transitions = nn.ModuleList(Transition(dim=token_z, hidden=2 * token_z) for _ in range(num_transitions))

    def forward(self, z_trunk: Tensor, relative_position_encoding: Tensor) -> Tensor:
        z = self.dim_pairwise_init_proj(torch.cat((z_trunk, relative_position_encoding), dim=-1))
        for transition in self.transitions:
            z = transition(z) + z
        return z


def _bias_heads(width: int, heads: int, depth: int) -> nn.ModuleList:
    """One LayerNorm + bias-free projection to `heads` per transformer layer."""
    return nn.ModuleList(nn.Sequential(LayerNorm(width), nn.Linear(width, heads, bias=False)) for _ in range(depth))


class DiffusionConditioning(nn.Module):
    """Conditions atom features on the trunk and projects the per-layer attention biases."""

    def __init__(self, config: Boltz2Config) -> None:
        super().__init__()
        self.pairwise_conditioner = PairwiseConditioning(
            token_z=config.token_z,
            dim_token_rel_pos_feats=config.token_z,
            num_transitions=config.conditioning_transition_layers,
        )
        self.atom_encoder = AtomEncoder(
            atom_s=config.atom_s,
            atom_z=config.atom_z,
            token_s=config.token_s,
            token_z=config.token_z,
            atoms_per_window_queries=config.atoms_per_window_queries,
            atoms_per_window_keys=config.atoms_per_window_keys,
            atom_feature_dim=config.atom_feature_dim,
            structure_prediction=True,
        )
        self.atom_enc_proj_z = _bias_heads(
            config.atom_z, config.diffusion_atom_encoder_heads, config.diffusion_atom_encoder_depth
        )
        self.atom_dec_proj_z = _bias_heads(config.atom_z, config.atom_decoder_heads, config.atom_decoder_depth)
        self.token_trans_proj_z = _bias_heads(
            config.token_z, config.token_transformer_heads, config.token_transformer_depth
        )

    def forward(
        self,
        s_trunk: Tensor,
        z_trunk: Tensor,
        relative_position_encoding: Tensor,
        feats: dict[str, Tensor],
        pairs_per_block: int | None = None,
    ) -> DiffusionConditioningOutput:
        tokens = z_trunk.shape[1]
        rows = rows_per_block(tokens, pairs_per_block)
        z = by_token_rows(
            lambda block: self.pairwise_conditioner(z_trunk[:, block], relative_position_encoding[:, block]),
            tokens,
            rows,
        )
        q, c, p = self.atom_encoder(feats=feats, s_trunk=s_trunk, z=z)
        atom_enc_bias = torch.cat([project(p) for project in self.atom_enc_proj_z], dim=-1)
        atom_dec_bias = torch.cat([project(p) for project in self.atom_dec_proj_z], dim=-1)
        del p
        return DiffusionConditioningOutput(
            q=q,
            c=c,
            atom_enc_bias=atom_enc_bias,
            atom_dec_bias=atom_dec_bias,
            token_trans_bias=self.token_transformer_bias(z, rows),
        )

    def token_transformer_bias(self, z: Tensor, rows: int) -> Tensor:
        """(B, T, T, depth*H) from the conditioned pairs z, `rows` token rows at a time, written into
        layer-major storage (B, depth, H, T, T): the transformer slices one layer and moves heads
        first, which on the default layout would be a strided gather of the whole bias per layer and step."""
        batch, tokens = z.shape[:2]
        depth = len(self.token_trans_proj_z)
        storage = None
        for start in range(0, tokens, rows):
            block = z[:, start : start + rows]
            for layer, project in enumerate(self.token_trans_proj_z):
                values = project(block)  # (B, rows, T, H)
                if storage is None:
                    storage = values.new_empty((batch, depth, values.shape[-1], tokens, tokens))
                storage[:, layer, :, start : start + rows] = values.permute(0, 3, 1, 2)
        assert storage is not None
        return storage.permute(0, 3, 4, 1, 2).view(batch, tokens, tokens, -1)
