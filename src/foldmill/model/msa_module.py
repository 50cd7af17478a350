"""MSA module (AF3 Algorithm 8, Boltz-2 variant): refines the pair representation with the MSA.

forward(z (B, N, N, token_z), emb (B, N, token_s) = s_inputs, feats) -> z (B, N, N, token_z),
the refined pair representation (input included; Boltz-2 adds it to z once more).
feats used: msa (B, S, N) int classes, has_deletion (B, S, N), deletion_value (B, S, N),
msa_paired (B, S, N), msa_mask (B, S, N), token_pad_mask (B, N).

Per block (MSALayer): m += pair-weighted averaging(m, z); m += transition(m);
z += outer product mean(m); z = pair-only pairformer block(z).
Parameter names (s_proj, msa_proj, layers.{i}.pair_weighted_averaging / msa_transition /
outer_product_mean / pairformer_layer) match the Boltz-2 checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.functional import one_hot

from foldmill.model.layers.outer_product_mean import OuterProductMean
from foldmill.model.layers.pair_weighted_average import PairWeightedAveraging
from foldmill.model.layers.pairformer import LARGE_INPUT_TOKENS, PairformerNoSeqLayer, triangle_attention_chunk_size
from foldmill.model.layers.transition import Transition
from foldmill.model.residual import accumulate
from foldmill.vocab import NUM_TOKENS

# Above LARGE_INPUT_TOKENS the outer product mean runs by token rows, each row block's outer product
# within OUTER_PRODUCT_BLOCK_BYTES (Boltz-2's channel chunks hold (N, N, 4 * 32) fp32 blocks and their
# bf16 copies: ~1.3 GB of temporaries at 1,000 tokens, 18 GB at 6,000).
OUTER_PRODUCT_BLOCK_BYTES = 256 << 20


@dataclass(frozen=True)
class MSAChunking:
    """Memory bounds for one MSA forward; chunking changes only summation order."""

    pair_averaging_by_head: bool = False
    msa_transition: int | None = None
    triangle_attention: int | None = None
    outer_product_rows: int | None = None

    @classmethod
    def for_tokens(cls, num_tokens: int) -> MSAChunking:
        """Boltz-2's inference policy, chunk everything above LARGE_INPUT_TOKENS, with the outer product
        by token rows instead of its channel chunks."""
        if num_tokens > LARGE_INPUT_TOKENS:
            rows = max(1, OUTER_PRODUCT_BLOCK_BYTES // (num_tokens * 32 * 32 * 4))
            return cls(True, 32, triangle_attention_chunk_size(num_tokens), rows)
        return cls(triangle_attention=triangle_attention_chunk_size(num_tokens))


class MSALayer(nn.Module):
    """One MSA block."""

    def __init__(self, msa_s: int, token_z: int, pairwise_head_width: int = 32, pairwise_num_heads: int = 4) -> None:
        super().__init__()
        self.msa_transition = Transition(dim=msa_s, hidden=msa_s * 4)
        self.pair_weighted_averaging = PairWeightedAveraging(c_m=msa_s, c_z=token_z, c_h=32, num_heads=8)
        self.pairformer_layer = PairformerNoSeqLayer(token_z, pairwise_head_width, pairwise_num_heads)
        self.outer_product_mean = OuterProductMean(c_in=msa_s, c_hidden=32, c_out=token_z)

    def forward(
        self,
        z: Tensor,
        m: Tensor,
        token_pair_mask: Tensor,
        msa_mask: Tensor,
        chunking: MSAChunking,
        in_place: bool = False,
    ) -> tuple[Tensor, Tensor]:
        """in_place: z is the caller's to overwrite (see PairformerNoSeqLayer.update_pair)."""
        m = m + self.pair_weighted_averaging(m, z, token_pair_mask, chunking.pair_averaging_by_head)
        m = m + self.msa_transition(m, chunking.msa_transition)
        z = accumulate(z, self.outer_product_mean(m, msa_mask, chunking.outer_product_rows), in_place)
        # z is this block's own from here on
        z = self.pairformer_layer(z, token_pair_mask, chunking.triangle_attention, in_place=True)
        return z, m


class MSAModule(nn.Module):
    """Embeds the MSA and runs `msa_blocks` MSA blocks."""

    def __init__(
        self,
        msa_s: int,
        token_z: int,
        token_s: int,
        msa_blocks: int,
        pairwise_head_width: int = 32,
        pairwise_num_heads: int = 4,
        use_paired_feature: bool = True,
        subsample_msa: bool = False,
        num_subsampled_msa: int = 1024,
        **training_options: Any,
    ) -> None:
        """training_options (msa_dropout, z_dropout, activation_checkpointing) are accepted and ignored."""
        super().__init__()
        self.use_paired_feature = use_paired_feature
        self.subsample_msa = subsample_msa
        self.num_subsampled_msa = num_subsampled_msa
        self.s_proj = nn.Linear(token_s, msa_s, bias=False)
        # one-hot residue class, has_deletion, deletion_value (+ is_paired)
        self.msa_proj = nn.Linear(NUM_TOKENS + 2 + int(use_paired_feature), msa_s, bias=False)
        self.layers = nn.ModuleList(
            MSALayer(msa_s, token_z, pairwise_head_width, pairwise_num_heads) for _ in range(msa_blocks)
        )

    def forward(
        self, z: Tensor, emb: Tensor, feats: dict[str, Tensor], generator: torch.Generator | None = None
    ) -> Tensor:
        """generator draws the MSA row subsample (subsample_msa); None uses torch's global RNG, as Boltz-2 does."""
        columns = [
            one_hot(feats["msa"], num_classes=NUM_TOKENS),
            feats["has_deletion"].unsqueeze(-1),
            feats["deletion_value"].unsqueeze(-1),
        ]
        if self.use_paired_feature:
            columns.append(feats["msa_paired"].unsqueeze(-1))
        m = torch.cat(columns, dim=-1)
        msa_mask = feats["msa_mask"]
        if self.subsample_msa:
            rows = torch.randperm(m.shape[1], generator=generator)[: self.num_subsampled_msa]
            m = m[:, rows]
            msa_mask = msa_mask[:, rows]
        m = self.msa_proj(m) + self.s_proj(emb).unsqueeze(1)

        token_mask = feats["token_pad_mask"].float()
        token_pair_mask = token_mask[:, :, None] * token_mask[:, None, :]
        chunking = MSAChunking.for_tokens(z.shape[1])
        for index, layer in enumerate(self.layers):  # the input z is the caller's; later ones are the module's
            z, m = layer(z, m, token_pair_mask, msa_mask, chunking, in_place=index > 0)
        return z
