"""Boltz-2 building blocks (fp32 reference path). Each routed op's math sits in one plain function in its
layer's module, registered as the op's reference (foldmill.kernels.ops lists them), so a GPU kernel can
replace it without touching the modules."""

from foldmill.model.layers.attention_pair_bias import AttentionPairBias
from foldmill.model.layers.fourier_embedding import FourierEmbedding
from foldmill.model.layers.outer_product_mean import OuterProductMean
from foldmill.model.layers.pair_weighted_average import PairWeightedAveraging
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
)
from foldmill.model.layers.triangle_multiplication import (
    TriangleMultiplicationIncoming,
    TriangleMultiplicationOutgoing,
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
]
