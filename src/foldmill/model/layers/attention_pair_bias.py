"""Gated multi-head attention with a per-head pair bias, AF3 Algorithm 24.

forward(s (B, S, c_s), z, mask (B, K), k_in (B, K, c_s), multiplicity) -> (B, S, c_s).
With compute_pair_bias=True (trunk, confidence) z is the pair representation
(B', S, K, c_z) and is projected to one bias per head; with compute_pair_bias=False
(diffusion transformer) z is already the bias (B', S, K, H). B' = B / multiplicity: the
bias is shared by the `multiplicity` samples stacked in s (broadcast, not copied, when B' = 1).

`attention_pair_bias` is the core (q, k, v (B, L, H, D), bias (B, H, S, K)), kept
apart so a kernel can replace it: the module calls it through the kernel registry
(foldmill.kernels). Parameter names (proj_q/k/v/g/o, proj_z.0 the LayerNorm, proj_z.1 the
bias projection) match the Boltz-2 checkpoint.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from foldmill import kernels
from foldmill.model.layers.layer_norm import LayerNorm, normed_and_heads


def attention_pair_bias(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, mask: Tensor, inf: float) -> Tensor:
    """softmax(q k^T / sqrt(D) + bias - inf * (1 - mask)) v.

    q: (B, S, H, D); k, v: (B, K, H, D); bias: (B, H, S, K); mask: (B, K). Returns (B, S, H, D).
    """
    head_dim = q.shape[-1]
    logits = torch.einsum("bihd,bjhd->bhij", q.float(), k.float())
    logits = logits / (head_dim**0.5) + bias.float()
    logits = logits + (1 - mask[:, None, None].float()) * -inf
    weights = logits.softmax(dim=-1)
    return torch.einsum("bhij,bjhd->bihd", weights, v.float()).to(v.dtype)


def shared_by_samples(bias: Tensor, multiplicity: int) -> Tensor:
    """bias (B', ...) -> (B' * multiplicity, ...), record-major. With one record (B' = 1) the
    samples read the same storage (a stride-0 view, no copy per layer and step); SDPA and the
    reference broadcast it."""
    if multiplicity == 1:
        return bias
    if bias.shape[0] == 1:
        return bias.expand(multiplicity, *bias.shape[1:])
    return bias.repeat_interleave(multiplicity, 0)


class AttentionPairBias(nn.Module):
    """Single-track attention whose logits are biased by the pair representation."""

    def __init__(
        self,
        c_s: int,
        c_z: int | None = None,
        num_heads: int | None = None,
        inf: float = 1e6,
        compute_pair_bias: bool = True,
    ) -> None:
        super().__init__()
        if num_heads is None or c_s % num_heads:
            raise ValueError(f"c_s={c_s} must be a multiple of num_heads={num_heads}")
        self.c_s = c_s
        self.num_heads = num_heads
        self.head_dim = c_s // num_heads
        self.inf = inf
        self.compute_pair_bias = compute_pair_bias
        self.proj_q = nn.Linear(c_s, c_s)
        self.proj_k = nn.Linear(c_s, c_s, bias=False)
        self.proj_v = nn.Linear(c_s, c_s, bias=False)
        self.proj_g = nn.Linear(c_s, c_s, bias=False)
        if compute_pair_bias:
            if c_z is None:
                raise ValueError("c_z is required when compute_pair_bias=True")
            self.proj_z = nn.Sequential(LayerNorm(c_z), nn.Linear(c_z, num_heads, bias=False))
        self.proj_o = nn.Linear(c_s, c_s, bias=False)

    def forward(self, s: Tensor, z: Tensor, mask: Tensor, k_in: Tensor, multiplicity: int = 1) -> Tensor:
        batch = s.shape[0]
        q = self.proj_q(s).view(batch, -1, self.num_heads, self.head_dim)
        k = self.proj_k(k_in).view(batch, -1, self.num_heads, self.head_dim)
        v = self.proj_v(k_in).view(batch, -1, self.num_heads, self.head_dim)
        if self.compute_pair_bias:  # heads first, the pair read once for its norm and the projection
            bias = normed_and_heads(self.proj_z[0], self.proj_z[1], z, keep_normed=False)[1]
        else:
            bias = z.movedim(-1, 1)
        bias = shared_by_samples(bias, multiplicity)
        gate = self.proj_g(s).sigmoid()
        out = kernels.dispatch("attention_pair_bias", q, k, v, bias, mask, self.inf)
        return self.proj_o(gate * out.reshape(batch, -1, self.c_s))


# The plain PyTorch implementations the kernel registry runs where no backend applies.
kernels.register_reference("attention_pair_bias", attention_pair_bias)
