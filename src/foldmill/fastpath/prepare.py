"""The fast path's passes over a Boltz2, applied by one function, `prepare`, in this order (each works on
what the one before made):

1. score model: a copy whose linear weights are stored in the score precision, its coordinate- and
   noise-facing layers (FP32_SCORE_LAYERS) kept in fp32 (`low_precision_score_model`); in fp32 the
   model's own, copied only when it moves to another device.
2. network: a copy of the rest of the model whose linear weights are stored in the network precision
   (triangle multiplications keep fp32 weights: cuEquivariance reads them itself under autocast, as in
   OSS Boltz-2) and whose LayerNorms compute in fp32 and return the compute dtype (the model's
   `LayerNorm.in_compute_dtype` hook), holding step 1's score model in its place
   (`low_precision_network`). In fp32 the model itself, copied only when it moves.
3. device: the copies go to the runner's device; the caller's model stays where it is, untouched.
4. CUDA graphs: the trunk's pairformer stack (and, where asked, the confidence module's) is wrapped to
   replay a graph per shape (`GraphedPairformer`), on a copy only.
5. the fused score model (foldmill.fastpath.score) over step 1's copy, with kernels on.

Sampling graphs (a whole sampler step, or the score-model call) belong to each sampling run and are
made by the runner (foldmill.fastpath.runner). Parameter names are unchanged by every pass.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from foldmill.fastpath.cuda_graphs import GraphedCall
from foldmill.fastpath.score import FastScoreModel
from foldmill.model.boltz2 import Boltz2
from foldmill.model.diffusion import DiffusionModule
from foldmill.model.layers.layer_norm import LayerNorm
from foldmill.model.layers.pairformer import PairformerModule
from foldmill.model.layers.triangle_multiplication import TriangleMultiplicationIncoming, TriangleMultiplicationOutgoing

# Score-model layers kept in fp32: those that see coordinates or the noise level directly, and the
# once-per-run trunk embedding (the samplers call it outside autocast, on the fp32 trunk s).
FP32_SCORE_LAYERS = (
    "single_conditioner.fourier_embed",
    "single_conditioner.single_embed",
    "atom_attention_encoder.r_to_q_trans",
    "atom_attention_decoder.atom_feat_to_atom_pos_update",
)


@dataclass(frozen=True)
class PrepareOptions:
    """What the passes need from FastPathOptions."""

    dtype: torch.dtype  # the network's
    score_dtype: torch.dtype
    kernels: bool
    cuda_graphs: bool
    max_trunk_graph_tokens: int
    max_confidence_graph_tokens: int
    graph_capacity: int


@dataclass
class FastNetworks:
    network: Boltz2  # what the stages run from
    score_model: DiffusionModule  # the network's score model
    fast_score: FastScoreModel | None  # the fused score model (kernels on)


def prepare(model: Boltz2, options: PrepareOptions, device: torch.device) -> FastNetworks:
    """Apply the passes of the module docstring, in its order, to copies of `model` (never to `model`)."""
    moved = device != next(model.parameters()).device
    original_score_model = model.structure_module.score_model
    # 1. score model
    score_model = original_score_model
    if options.score_dtype != torch.float32:
        score_model = low_precision_score_model(score_model, options.score_dtype)
    elif moved:
        score_model = copy.deepcopy(score_model)
    # 3. (for the score model: the network below holds it)
    score_model = score_model.to(device)
    # 2. network, 3. device
    if options.dtype != torch.float32:
        network = low_precision_network(model, options.dtype, score_model).to(device)
    elif moved:
        network = copy.deepcopy(model, memo={id(original_score_model): score_model}).to(device)
    else:
        network = model
    # 4. CUDA graphs of the pairformer stacks
    if options.cuda_graphs and network is not model:
        network.pairformer_module = GraphedPairformer(
            network.pairformer_module, options.max_trunk_graph_tokens, options.graph_capacity
        )
        if options.max_confidence_graph_tokens > 0:
            confidence = network.confidence_module
            confidence.pairformer_stack = GraphedPairformer(
                confidence.pairformer_stack, options.max_confidence_graph_tokens, options.graph_capacity
            )
    # 5. the fused score model; its fused projections take over the weights' storage when the score
    # model is the runner's own copy
    fast_score = None
    if options.kernels:
        fast_score = FastScoreModel(score_model, score_model is not original_score_model)
    return FastNetworks(network, score_model, fast_score)


class _Float32(nn.Module):
    """Runs the wrapped module in fp32 with autocast off, whatever the surrounding precision."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: Tensor) -> Tensor:
        with torch.autocast(x.device.type, enabled=False):
            return self.module(x.float())


def low_precision_score_model(score_model: DiffusionModule, dtype: torch.dtype) -> DiffusionModule:
    """A copy of the score model with linear weights in `dtype`, FP32_SCORE_LAYERS wrapped in fp32."""
    clone = copy.deepcopy(score_model)
    for name in FP32_SCORE_LAYERS:
        parent_name, _, attribute = name.rpartition(".")
        parent = clone.get_submodule(parent_name)
        setattr(parent, attribute, _Float32(getattr(parent, attribute)))
    keep = {id(m) for wrapper in clone.modules() if isinstance(wrapper, _Float32) for m in wrapper.modules()}
    _cast_linears(clone, dtype, keep)
    return clone.eval()


def _cast_linears(root: nn.Module, dtype: torch.dtype, keep: set[int]) -> None:
    """Every nn.Linear under `root` to `dtype`, except the modules whose ids are in `keep`."""
    for module in root.modules():
        if isinstance(module, nn.Linear) and id(module) not in keep:
            module.to(dtype)


def low_precision_network(model: Boltz2, dtype: torch.dtype, score_model: DiffusionModule | None = None) -> Boltz2:
    """A copy of `model` for the low-precision stages: linear weights in `dtype`, LayerNorms in the compute
    dtype (`LayerNorm.in_compute_dtype`).

    The diffusion score model is not copied: the copy holds `score_model` in its place (the runner's
    own, see low_precision_score_model; default: the model's, shared, whose norms are left alone);
    triangle multiplications keep fp32 weights. Parameter names are unchanged.
    """
    original = model.structure_module.score_model
    if score_model is None:
        score_model = original
    clone = copy.deepcopy(model, memo={id(original): score_model})
    shared = {id(module) for module in score_model.modules()}
    fp32_weights = {
        id(module)
        for owner in clone.modules()
        if isinstance(owner, (TriangleMultiplicationOutgoing, TriangleMultiplicationIncoming))
        for module in owner.modules()
    }
    for module in clone.modules():
        if isinstance(module, LayerNorm) and id(module) not in shared:
            module.in_compute_dtype = True
    _cast_linears(clone, dtype, shared | fp32_weights)
    return clone.eval()


class GraphedPairformer(nn.Module):
    """A pairformer stack (the trunk's, one call per recycle; optionally the confidence module's),
    replayed from a CUDA graph per shape.

    The first call of a shape runs eagerly (cuEquivariance/Triton autotune there, never inside a
    capture), then GraphedCall captures; every input is per call. Outputs are cloned out of the
    graph's static buffers, which the next replay overwrites.
    """

    def __init__(self, stack: PairformerModule, max_tokens: int, capacity: int) -> None:
        super().__init__()
        self.stack = stack
        self.max_tokens = max_tokens
        self.graphs = GraphedCall(self.stack, per_call=(True, True, True, True), capacity=capacity)

    def forward(
        self, s: Tensor, z: Tensor, mask: Tensor, pair_mask: Tensor, in_place: bool = False
    ) -> tuple[Tensor, Tensor]:
        """in_place as PairformerModule's (replays always work on the graph's own copies)."""
        if not z.is_cuda or z.shape[1] > self.max_tokens:
            return self.stack(s, z, mask, pair_mask, in_place)
        s, z = self.graphs(s, z, mask, pair_mask)
        return s.clone(), z.clone()
