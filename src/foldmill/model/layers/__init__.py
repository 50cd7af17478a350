"""Boltz-2 building blocks (fp32 reference path). Each op's math sits in one plain function
(`triangle_multiplicative_update`, `triangle_attention_core`, `attention_with_pair_bias`) so a
GPU kernel can replace it without touching the modules."""

from foldmill.model.layers.attention_pair_bias import AttentionPairBias, attention_with_pair_bias
from foldmill.model.layers.fourier_embedding import FourierEmbedding
from foldmill.model.layers.outer_product_mean import OuterProductMean
from foldmill.model.layers.pair_weighted_averaging import PairWeightedAveraging
from foldmill.model.layers.pairformer import (
    PairformerLayer,
    PairformerModule,
    PairformerNoSeqLayer,
    PairformerNoSeqModule,
)
from foldmill.model.layers.transition import Transition
from foldmill.model.layers.triangle_attention import (
    TriangleAttention,
    TriangleAttentionEndingNode,
    TriangleAttentionStartingNode,
    triangle_attention_core,
)
from foldmill.model.layers.triangle_multiplication import (
    TriangleMultiplicationIncoming,
    TriangleMultiplicationOutgoing,
    triangle_multiplicative_update,
)

__all__ = [
    "AttentionPairBias",
    "FourierEmbedding",
    "OuterProductMean",
    "PairWeightedAveraging",
    "PairformerLayer",
    "PairformerModule",
    "PairformerNoSeqLayer",
    "PairformerNoSeqModule",
    "Transition",
    "TriangleAttention",
    "TriangleAttentionEndingNode",
    "TriangleAttentionStartingNode",
    "TriangleMultiplicationIncoming",
    "TriangleMultiplicationOutgoing",
    "attention_with_pair_bias",
    "triangle_attention_core",
    "triangle_multiplicative_update",
]
