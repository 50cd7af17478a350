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
from torch.nn.functional import one_hot

# Stand-in period for linear chains when any chain in the batch is cyclic: wrapping by it
# never changes an offset.
_NO_PERIOD = 10000


def _pairwise(feature: Tensor, rows: slice) -> tuple[Tensor, Tensor]:
    """(query tokens i of `rows`, key tokens j) views for pairwise comparison."""
    return feature[:, rows, None], feature[:, None, :]


def _clipped_one_hot(offset: Tensor, keep: Tensor, limit: int) -> Tensor:
    """One-hot of offset + limit clipped to [0, 2*limit]; pairs with keep=False get class 2*limit+1."""
    index = torch.clip(offset + limit, 0, 2 * limit)
    index = torch.where(keep, index, torch.full_like(index, 2 * limit + 1))
    return one_hot(index, 2 * limit + 2)


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
        callers at large token counts go by blocks of rows: the one-hot blocks are int64)."""
        asym_i, asym_j = _pairwise(feats["asym_id"], rows)
        residue_i, residue_j = _pairwise(feats["residue_index"], rows)
        entity_i, entity_j = _pairwise(feats["entity_id"], rows)
        token_i, token_j = _pairwise(feats["token_index"], rows)
        sym_i, sym_j = _pairwise(feats["sym_id"], rows)
        same_chain = asym_i == asym_j
        same_residue = residue_i == residue_j
        same_entity = entity_i == entity_j

        residue_block = _clipped_one_hot(self._residue_offset(feats, rows), same_chain, self.r_max)
        token_block = _clipped_one_hot(token_i - token_j, same_chain & same_residue, self.r_max)
        chain_keep = same_entity if self.fix_sym_check else ~same_chain
        chain_block = _clipped_one_hot(sym_i - sym_j, chain_keep, self.s_max)

        features = torch.cat(
            [residue_block.float(), token_block.float(), same_entity.unsqueeze(-1).float(), chain_block.float()],
            dim=-1,
        )
        return self.linear_layer(features)
