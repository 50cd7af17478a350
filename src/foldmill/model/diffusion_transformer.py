"""Conditioned transformer of the diffusion module, AF3 Algorithms 23, 25, 26.

DiffusionTransformer(a (B*M, L, dim), s (B*M, L, dim_cond), bias (B, L, K, depth*heads),
mask (B*M, K)) -> (B*M, L, dim). M is the number of diffusion samples stacked in the batch
(`multiplicity`); the bias is shared by a record's samples. Each layer normalises `a`
adaptively from `s` (AdaLN), attends with the layer's slice of the precomputed pair bias,
gates the result from `s`, and adds a conditioned SwiGLU transition.

With `key_windows` (the atom transformer), the L queries of a row attend to K keys taken
from a wider window of the same sequence (see `foldmill.model.atom_attention.AtomWindows`).
Parameter names match the Boltz-2 checkpoint.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from foldmill.model.layers.attention_pair_bias import AttentionPairBias
from foldmill.model.layers.layer_norm import LayerNorm

KeyWindows = Callable[[Tensor], Tensor]


class AdaLN(nn.Module):
    """Adaptive LayerNorm: LN(a) scaled by sigmoid(W s + b) and shifted by W' s, with s normalised."""

    def __init__(self, dim: int, dim_single_cond: int) -> None:
        super().__init__()
        self.a_norm = LayerNorm(dim, elementwise_affine=False, bias=False)
        self.s_norm = LayerNorm(dim_single_cond, bias=False)
        self.s_scale = nn.Linear(dim_single_cond, dim)
        self.s_bias = nn.Linear(dim_single_cond, dim, bias=False)

    def forward(self, a: Tensor, s: Tensor) -> Tensor:
        a = self.a_norm(a)
        s = self.s_norm(s)
        return torch.sigmoid(self.s_scale(s)) * a + self.s_bias(s)


class SwiGLU(nn.Module):
    """silu(second half) * first half of the last dimension."""

    def forward(self, x: Tensor) -> Tensor:
        x, gates = x.chunk(2, dim=-1)
        return F.silu(gates) * x


class ConditionedTransitionBlock(nn.Module):
    """SwiGLU transition on AdaLN(a, s), its output gated by sigmoid(W s + b)."""

    def __init__(self, dim_single: int, dim_single_cond: int, expansion_factor: int = 2) -> None:
        super().__init__()
        dim_inner = dim_single * expansion_factor
        self.adaln = AdaLN(dim_single, dim_single_cond)
        self.swish_gate = nn.Sequential(nn.Linear(dim_single, dim_inner * 2, bias=False), SwiGLU())
        self.a_to_b = nn.Linear(dim_single, dim_inner, bias=False)
        self.b_to_a = nn.Linear(dim_inner, dim_single, bias=False)
        self.output_projection = nn.Sequential(_gate_linear(dim_single_cond, dim_single), nn.Sigmoid())

    def forward(self, a: Tensor, s: Tensor) -> Tensor:
        a = self.adaln(a, s)
        b = self.swish_gate(a) * self.a_to_b(a)
        return self.output_projection(s) * self.b_to_a(b)


def _gate_linear(dim_in: int, dim_out: int) -> nn.Linear:
    """Output gate projection, initialised closed (sigmoid(-2)) as in AF3."""
    linear = nn.Linear(dim_in, dim_out)
    nn.init.zeros_(linear.weight)
    nn.init.constant_(linear.bias, -2.0)
    return linear


class DiffusionTransformerLayer(nn.Module):
    """One layer: gated pair-biased attention on AdaLN(a), then a conditioned transition."""

    def __init__(self, heads: int, dim: int, dim_single_cond: int) -> None:
        super().__init__()
        self.adaln = AdaLN(dim, dim_single_cond)
        self.pair_bias_attn = AttentionPairBias(c_s=dim, num_heads=heads, compute_pair_bias=False)
        # The checkpoint stores the gate linear under both names (one shared module).
        self.output_projection_linear = _gate_linear(dim_single_cond, dim)
        self.output_projection = nn.Sequential(self.output_projection_linear, nn.Sigmoid())
        self.transition = ConditionedTransitionBlock(dim_single=dim, dim_single_cond=dim_single_cond)

    def forward(
        self,
        a: Tensor,
        s: Tensor,
        bias: Tensor,
        mask: Tensor,
        key_windows: KeyWindows | None = None,
        multiplicity: int = 1,
    ) -> Tensor:
        b = self.adaln(a, s)
        keys = b
        if key_windows is not None:
            keys = key_windows(b)
            mask = key_windows(mask.unsqueeze(-1)).squeeze(-1)
        b = self.pair_bias_attn(s=b, z=bias, mask=mask, k_in=keys, multiplicity=multiplicity)
        a = a + self.output_projection(s) * b
        return a + self.transition(a, s)


class DiffusionTransformer(nn.Module):
    """`depth` DiffusionTransformerLayers sharing one precomputed bias tensor (a slice per layer)."""

    def __init__(self, depth: int, heads: int, dim: int, dim_single_cond: int | None = None) -> None:
        super().__init__()
        dim_single_cond = dim if dim_single_cond is None else dim_single_cond
        self.layers = nn.ModuleList(DiffusionTransformerLayer(heads, dim, dim_single_cond) for _ in range(depth))

    def forward(
        self,
        a: Tensor,
        s: Tensor,
        bias: Tensor,
        mask: Tensor,
        key_windows: KeyWindows | None = None,
        multiplicity: int = 1,
    ) -> Tensor:
        """bias: (B, L, K, depth * heads), layer-major in its last dimension."""
        per_layer = bias.view(*bias.shape[:3], len(self.layers), -1)
        for index, layer in enumerate(self.layers):
            a = layer(a, s, per_layer[:, :, :, index], mask, key_windows, multiplicity)
        return a
