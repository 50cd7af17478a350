"""Template module v2 (Boltz-2): pair update from T structural templates.

forward(z (B, N, N, token_z), feats, pair_mask (B, N, N)) -> update (B, N, N, token_z)
(the caller adds it to z). feats used, per template t:
template_restype (B, T, N, 33) one-hot, template_frame_rot (B, T, N, 3, 3),
template_frame_t (B, T, N, 3), template_ca / template_cb (B, T, N, 3),
template_mask_frame / template_mask_cb / template_mask (B, T, N), visibility_ids (B, T, N).

Template pair features (CB distogram, backbone-frame unit vectors, masks) are kept only
between tokens with the same visibility id (tokens a template places together), combined
with both tokens' template residue types, projected and added to the projected z; each
template runs through a pair-only pairformer; the mean over present templates is projected
back to token_z. Parameter names (z_norm, v_norm, z_proj, a_proj, u_proj, pairformer.*)
match the Boltz-2 checkpoint.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.functional import one_hot

from foldmill.model.layers.layer_norm import LayerNorm
from foldmill.model.layers.pairformer import PairformerNoSeqModule
from foldmill.vocab import NUM_TOKENS


def _unit_vectors_in_frames(frame_rot: Tensor, frame_t: Tensor, ca: Tensor) -> Tensor:
    """vec[b, t, i, j] = R_j^T (ca_i - t_j), normalised (0 where the norm is 0): (B, T, N, N, 3)."""
    rot_t = frame_rot.unsqueeze(2).transpose(-1, -2)  # (B, T, 1, N, 3, 3): frame j
    origin = frame_t.unsqueeze(2).unsqueeze(-1)  # (B, T, 1, N, 3, 1)
    points = ca.unsqueeze(3).unsqueeze(-1)  # (B, T, N, 1, 3, 1): atom i
    vector = torch.matmul(rot_t, points - origin)
    norm = torch.norm(vector, dim=-1, keepdim=True)
    return torch.where(norm > 0, vector / norm, torch.zeros_like(vector)).squeeze(-1)


class TemplateV2Module(nn.Module):
    """Template embedding with a pair-only pairformer per template."""

    def __init__(
        self,
        token_z: int,
        template_dim: int,
        template_blocks: int,
        pairwise_head_width: int = 32,
        pairwise_num_heads: int = 4,
        min_dist: float = 3.25,
        max_dist: float = 50.75,
        num_bins: int = 38,
        **training_options: Any,
    ) -> None:
        """training_options (dropout, post_layer_norm, activation_checkpointing) are accepted and ignored."""
        super().__init__()
        self.min_dist = min_dist
        self.max_dist = max_dist
        self.num_bins = num_bins
        self.z_norm = LayerNorm(token_z)
        self.v_norm = LayerNorm(template_dim)
        self.z_proj = nn.Linear(token_z, template_dim, bias=False)
        # distogram bins + CB pair mask (1) + unit vector (3) + frame pair mask (1) + two residue types
        self.a_proj = nn.Linear(NUM_TOKENS * 2 + num_bins + 5, template_dim, bias=False)
        self.u_proj = nn.Linear(template_dim, token_z, bias=False)
        self.pairformer = PairformerNoSeqModule(
            template_dim,
            num_blocks=template_blocks,
            pairwise_head_width=pairwise_head_width,
            pairwise_num_heads=pairwise_num_heads,
        )

    def _template_pair_features(self, feats: dict[str, Tensor]) -> Tensor:
        """(B, T, N, N, 2*33 + num_bins + 5) input features of every template pair."""
        res_type = feats["template_restype"]
        cb = feats["template_cb"]
        cb_mask = feats["template_mask_cb"]
        frame_mask = feats["template_mask_frame"]
        visibility = feats["visibility_ids"]

        boundaries = torch.linspace(self.min_dist, self.max_dist, self.num_bins - 1).to(cb.device)
        # cdist exactly as Boltz-2 calls it: its matmul path decides which bin borderline pairs land in.
        distances = torch.cdist(cb, cb)
        distogram = one_hot((distances[..., None] > boundaries).sum(dim=-1).long(), num_classes=self.num_bins)
        unit_vector = _unit_vectors_in_frames(
            feats["template_frame_rot"], feats["template_frame_t"], feats["template_ca"]
        )
        cb_pair_mask = (cb_mask[:, :, :, None] * cb_mask[:, :, None, :])[..., None]
        frame_pair_mask = (frame_mask[:, :, :, None] * frame_mask[:, :, None, :])[..., None]
        visible = (visibility[:, :, :, None] == visibility[:, :, None, :]).float()
        geometry = torch.cat([distogram, cb_pair_mask, unit_vector, frame_pair_mask], dim=-1) * visible.unsqueeze(-1)

        n = res_type.shape[2]
        res_type_i = res_type[:, :, :, None].expand(-1, -1, -1, n, -1)
        res_type_j = res_type[:, :, None, :].expand(-1, -1, n, -1, -1)
        return torch.cat([geometry, res_type_i, res_type_j], dim=-1)

    def forward(self, z: Tensor, feats: dict[str, Tensor], pair_mask: Tensor) -> Tensor:
        batch, num_templates = feats["template_restype"].shape[:2]
        present = feats["template_mask"].any(dim=2).float()  # (B, T)
        count = present.sum(dim=1).clamp(min=1)

        v = self.z_proj(self.z_norm(z[:, None])) + self.a_proj(self._template_pair_features(feats))
        v = v.view(batch * num_templates, *v.shape[2:])
        template_pair_mask = pair_mask[:, None].expand(-1, num_templates, -1, -1)
        template_pair_mask = template_pair_mask.reshape(batch * num_templates, *pair_mask.shape[1:])
        v = v + self.pairformer(v, template_pair_mask)
        v = self.v_norm(v).view(batch, num_templates, *v.shape[1:])

        u = (v * present[:, :, None, None, None]).sum(dim=1) / count[:, None, None, None].to(v)
        return self.u_proj(torch.relu(u))
