"""Relative position encoding of token pairs, AF3 Algorithm 3 with Boltz-2's options.

feats (asym_id, residue_index, entity_id, token_index, sym_id, cyclic_period; each (B, N))
-> pair features (B, N, N, token_z). Parameter: linear_layer (bias-free), as in the
Boltz-2 checkpoint (`rel_pos.linear_layer.weight`, also inside the confidence module).

One-hot blocks, concatenated in this order before the projection:
- residue offset within a chain, clipped to [-r_max, r_max] (cyclic chains: wrapped to the
  shortest way round the ring), or a "different chain" class;
- token offset within the same residue (atomised residues, ligands), else a "not same
  residue" class;
- same-entity flag;
- chain copy offset (sym_id), clipped to [-s_max, s_max], or an "unrelated" class.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

# Stand-in period for linear chains when any chain in the batch is cyclic: wrapping by it
# never changes an offset.
_NO_PERIOD = 10000


def _pairwise(feature: Tensor, rows: slice) -> tuple[Tensor, Tensor]:
    """(query tokens i of `rows`, key tokens j) views for pairwise comparison."""
    return feature[:, rows, None], feature[:, None, :]


def _clipped_class(offset: Tensor, keep: Tensor, limit: int) -> Tensor:
    """offset + limit clipped to [0, 2*limit]; pairs with keep=False get class 2*limit+1 (of 2*limit+2)."""
    index = torch.clip(offset + limit, 0, 2 * limit)
    return torch.where(keep, index, torch.full_like(index, 2 * limit + 1))


class RelativePositionEncoder(nn.Module):
    """Encodes chain membership and sequence separation of every token pair."""

    def __init__(
        self, token_z: int, r_max: int = 32, s_max: int = 2, fix_sym_check: bool = False, cyclic_pos_enc: bool = False
    ) -> None:
        super().__init__()
        self.r_max = r_max
        self.s_max = s_max
        # fix_sym_check: encode chain-copy offsets for pairs of the same entity; without it,
        # they are encoded for pairs on different chains of any entity.
        self.fix_sym_check = fix_sym_check
        self.cyclic_pos_enc = cyclic_pos_enc
        self.linear_layer = nn.Linear(4 * (r_max + 1) + 2 * (s_max + 1) + 1, token_z, bias=False)

    def _residue_offset(self, feats: dict[str, Tensor], rows: slice) -> Tensor:
        residue_i, residue_j = _pairwise(feats["residue_index"], rows)
        offset = residue_i - residue_j
        period = feats["cyclic_period"]
        if self.cyclic_pos_enc and torch.any(period > 0):
            period = torch.where(period > 0, period, torch.full_like(period, _NO_PERIOD))
            # Key token j's chain period (both tokens share it whenever the offset is used; taking
            # j's matches Boltz-2 also on padding, whose asym_id 0 aliases the first chain).
            period = period[:, None, :]
            offset = (offset - period * torch.round(offset / period)).long()
        return offset

    def forward(self, feats: dict[str, Tensor], rows: slice = slice(None)) -> Tensor:
        """(B, rows, N, token_z): the encoding of the pairs (i, j) with i in `rows` (all by default;
        callers at large token counts go by blocks of rows: the one-hot features are pair-sized)."""
        asym_i, asym_j = _pairwise(feats["asym_id"], rows)
        residue_i, residue_j = _pairwise(feats["residue_index"], rows)
        entity_i, entity_j = _pairwise(feats["entity_id"], rows)
        token_i, token_j = _pairwise(feats["token_index"], rows)
        sym_i, sym_j = _pairwise(feats["sym_id"], rows)
        same_chain = asym_i == asym_j
        same_residue = residue_i == residue_j
        same_entity = entity_i == entity_j

        # The concatenated one-hot blocks, written as 1s into one fp32 tensor: the same input to the
        # projection as one_hot(...).float() concatenated, without the int64 one-hots and their copies
        # (2.6x faster on CPU, where this pair-sized projection was the demo model's largest cost).
        r_classes, s_classes = 2 * self.r_max + 2, 2 * self.s_max + 2
        residue_class = _clipped_class(self._residue_offset(feats, rows), same_chain, self.r_max)
        token_class = _clipped_class(token_i - token_j, same_chain & same_residue, self.r_max)
        chain_keep = same_entity if self.fix_sym_check else ~same_chain
        chain_class = _clipped_class(sym_i - sym_j, chain_keep, self.s_max)
        shape = torch.broadcast_shapes(residue_class.shape, token_class.shape, same_entity.shape, chain_class.shape)
        features = residue_class.new_zeros((*shape, 2 * r_classes + 1 + s_classes), dtype=torch.float32)
        for offset, classes in ((0, residue_class), (r_classes, token_class), (2 * r_classes + 1, chain_class)):
            features.scatter_(-1, (classes + offset).long().expand(shape).unsqueeze(-1), 1.0)
        features[..., 2 * r_classes] = same_entity.expand(shape)
        return self.linear_layer(features)
