"""The `attention` section of `foldmill bench moe`: one decoder layer's attention, forward and
backward, at the step model's shape, per implementation.

foldmill's default attention (ModelConfig.attention "torch") is torch's SDPA over whole windows
(cuDNN's flash kernels on Hopper) and FlexAttention under a document block mask where records are
packed (moe/model/attention.py). This section holds them against FlexAttention with a plain causal
mask, torch's FlashAttention 2 backend and, where flash-attn-4 is installed, FlashAttention 4's
CuTe DSL kernels (`flash_attn.cute`): foldmill's "flash_attn_4" attention (causal; records through
a mask on FlexAttention's block mask, static shapes) and, for reference, its variable-length
attention over the exact record bounds (the number of records on the host: not capturable for a
stream of batches). All on the same q, k and v: causal over the whole window, and within the step's
packed records of 50-800 tokens. Each case takes q, k, v as the projections lay them out, (batch,
seq, heads, head_dim), and hands back what the output projection reads, (batch, seq, heads x
head_dim), so a case pays for any transpose its library needs. FLOPs count the query-key pairs the
mask keeps: 4 x head_dim per pair and query head forward, 10 backward (the scores again, and four
products for the gradients).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from foldmill.moe.config import ModelConfig
from foldmill.moe.kernels.flash_attention_4 import flash_attention_4_installed
from foldmill.moe.model.attention import DocumentMask, attend, attended_pairs, document_mask, record_starts

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class AttentionCase:
    variant: str
    within_records: bool  # attention within each packed record; else causal over the whole window
    attend: Attend


def packed_records(batch: int, seq_len: int) -> torch.Tensor:
    """Document ids (batch, seq_len): records of 50-800 tokens packed back to back (proteins' median
    is about 400), the same in every run."""
    lengths = torch.randint(50, 801, (batch, seq_len // 50 + 1), generator=torch.Generator().manual_seed(0))
    return torch.stack([torch.repeat_interleave(torch.arange(row.numel()), row)[:seq_len] for row in lengths])


def record_bounds(document_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Where each record starts in the flattened (batch x seq) tokens, and where the last ends
    (int32, records + 1 values, variable-length attention's cu_seqlens), and the longest record's
    length. A window's end ends its last record."""
    first = record_starts(document_ids).flatten().nonzero().flatten()
    bounds = torch.cat([first, first.new_tensor([document_ids.numel()])]).to(torch.int32)
    return bounds, int(bounds.diff().max())


def attention_flops(document_ids: torch.Tensor, heads: int, head_dim: int) -> float:
    """Forward + backward FLOPs of attention within the records of `document_ids`, causal in each."""
    return 14.0 * head_dim * heads * attended_pairs(document_ids)


def attention_cases(documents: torch.Tensor) -> list[AttentionCase]:
    """foldmill's two attention paths, FlexAttention with a causal mask, and on CUDA torch's
    FlashAttention 2 backend and, where installed, FlashAttention 4, for `documents` (batch, seq)."""
    whole_windows = torch.zeros_like(documents)
    flex_causal, flex_records = document_mask(whole_windows), document_mask(documents)
    cases = [
        AttentionCase("foldmill torch, causal: torch SDPA (cuDNN flash attention on Hopper)", False,
                      functools.partial(_foldmill, mask=None)),
        AttentionCase("FlexAttention, causal block mask (compiled)", False, functools.partial(_foldmill, mask=flex_causal)),
        AttentionCase("foldmill torch, within records: FlexAttention, document block mask (compiled)", True,
                      functools.partial(_foldmill, mask=flex_records)),
    ]
    if documents.is_cuda:
        cases.append(AttentionCase("torch SDPA, FlashAttention 2 backend, causal", False, _flash_attention_2))
    if documents.is_cuda and flash_attention_4_installed():
        bounds, longest = record_bounds(documents)
        cases += [
            AttentionCase("foldmill flash_attn_4, causal: FlashAttention 4 (CuTe DSL)", False,
                          functools.partial(_foldmill, mask=None, kernels="flash_attn_4")),
            AttentionCase("foldmill flash_attn_4, within records: FlashAttention 4, mask on the document block mask",
                          True, functools.partial(_foldmill, mask=flex_records, kernels="flash_attn_4")),
            AttentionCase("FlashAttention 4, within records: variable-length, exact record bounds", True,
                          lambda q, k, v: _flash_attn_records(q, k, v, bounds, longest)),
        ]
    return cases


def _foldmill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: DocumentMask | None,
              kernels: str = "torch") -> torch.Tensor:
    """foldmill's attend, as the model calls it, the output in (batch, seq, heads x dim) for the
    output projection."""
    return attend(q, k, v, mask, kernels).reshape(q.shape[0], q.shape[1], -1)


def _flash_attention_2(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return _foldmill(q, k, v, None)


def _flash_attn_records(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: torch.Tensor,
                        longest: int) -> torch.Tensor:
    from flash_attn.cute import flash_attn_varlen_func

    out, _ = flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu_seqlens_q=bounds,
                                    cu_seqlens_k=bounds, max_seqlen_q=longest, max_seqlen_k=longest, causal=True)
    return out.reshape(q.shape[0], q.shape[1], -1)


@dataclass
class AttentionInputs:
    """Leaves q (batch, seq, heads, dim), k and v (batch, seq, kv_heads, dim), the gradient of the
    output, and the float32 attention each mask gives, with its gradients, as the reference."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    grad_out: torch.Tensor
    documents: torch.Tensor

    def forward_backward(self, case: AttentionCase) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        out = case.attend(self.q, self.k, self.v)
        return out, torch.autograd.grad(out, (self.q, self.k, self.v), self.grad_out)

    def mask_ids(self, within_records: bool) -> torch.Tensor:
        """The document ids a case's mask follows: the packed records, or one record per window."""
        return self.documents if within_records else torch.zeros_like(self.documents)

    def reference(self, within_records: bool) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """float32 attention through the dense boolean mask (torch's math path)."""
        from torch.nn.attention import SDPBackend, sdpa_kernel

        leaves = [t.detach().float().requires_grad_() for t in (self.q, self.k, self.v)]
        with sdpa_kernel(SDPBackend.MATH):
            out = _foldmill(*leaves, document_mask(self.mask_ids(within_records), "sdpa"))
        return out.detach(), torch.autograd.grad(out, leaves, self.grad_out.float())


def attention_inputs(config: ModelConfig, batch: int, seq_len: int, device: torch.device) -> AttentionInputs:
    generator = torch.Generator(device=device).manual_seed(0)

    def leaf(heads: int) -> torch.Tensor:
        values = torch.randn(batch, seq_len, heads, config.head_dim, device=device, generator=generator)
        return values.bfloat16().requires_grad_()

    q, k, v = leaf(config.num_heads), leaf(config.num_kv_heads), leaf(config.num_kv_heads)
    grad_out = torch.randn(batch, seq_len, config.num_heads * config.head_dim, device=device,
                           generator=generator).bfloat16()
    return AttentionInputs(q, k, v, grad_out, packed_records(batch, seq_len).to(device))
