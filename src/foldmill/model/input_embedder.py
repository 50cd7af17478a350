"""Input embedder (AF3 Algorithm 2, Boltz-2 variant): features -> s_inputs (B, T, token_s).

Per-atom reference features go through the atom encoder and a windowed atom transformer
and are averaged into tokens; residue type (33 classes), MSA profile and mean deletion are
added as linear embeddings, then Boltz-2's extra embeddings of the experimental method,
modified-residue flag, cyclic flag and molecule type (zero-initialised in training).
Parameter names match the Boltz-2 checkpoint (`input_embedder.*`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from foldmill.model.atom_attention import AtomAttentionEncoder, AtomEncoder
from foldmill.model.config import Boltz2Config
from foldmill.model.layers.layer_norm import LayerNorm
from foldmill.vocab import MOL_TYPES, NUM_TOKENS

# Rows of Boltz-2's experimental-method embedding (const.num_method_types; the
# featurizer's METHOD_TYPE_ID uses the first few).
NUM_METHOD_TYPES = 12


class InputEmbedder(nn.Module):
    """Token-level input embedding from atoms, residue types and MSA statistics."""

    def __init__(self, config: Boltz2Config) -> None:
        super().__init__()
        token_s = config.token_s
        depth, heads = config.embedder_atom_encoder_depth, config.embedder_atom_encoder_heads
        self.atom_encoder = AtomEncoder(
            atom_s=config.atom_s,
            atom_z=config.atom_z,
            token_s=token_s,
            token_z=config.token_z,
            atoms_per_window_queries=config.atoms_per_window_queries,
            atoms_per_window_keys=config.atoms_per_window_keys,
            atom_feature_dim=config.atom_feature_dim,
            structure_prediction=False,
        )
        self.atom_enc_proj_z = nn.Sequential(
            LayerNorm(config.atom_z), nn.Linear(config.atom_z, depth * heads, bias=False)
        )
        self.atom_attention_encoder = AtomAttentionEncoder(
            atom_s=config.atom_s,
            token_s=token_s,
            atoms_per_window_queries=config.atoms_per_window_queries,
            atoms_per_window_keys=config.atoms_per_window_keys,
            atom_encoder_depth=depth,
            atom_encoder_heads=heads,
            structure_prediction=False,
        )
        self.res_type_encoding = nn.Linear(NUM_TOKENS, token_s, bias=False)
        self.msa_profile_encoding = nn.Linear(NUM_TOKENS + 1, token_s, bias=False)
        self.method_conditioning_init = nn.Embedding(NUM_METHOD_TYPES, token_s)
        self.modified_conditioning_init = nn.Embedding(2, token_s)
        self.cyclic_conditioning_init = nn.Linear(1, token_s, bias=False)
        self.mol_type_conditioning_init = nn.Embedding(len(MOL_TYPES), token_s)

    def forward(self, feats: dict[str, Tensor]) -> Tensor:
        q, c, p = self.atom_encoder(feats)
        a, _, _ = self.atom_attention_encoder(feats=feats, q=q, c=c, bias=self.atom_enc_proj_z(p))
        profile = torch.cat([feats["profile"], feats["deletion_mean"].unsqueeze(-1)], dim=-1)
        s = a + self.res_type_encoding(feats["res_type"].float()) + self.msa_profile_encoding(profile)
        s = s + self.method_conditioning_init(feats["method_feature"])
        s = s + self.modified_conditioning_init(feats["modified"])
        s = s + self.cyclic_conditioning_init(feats["cyclic_period"].clamp(max=1.0).unsqueeze(-1))
        return s + self.mol_type_conditioning_init(feats["mol_type"])
