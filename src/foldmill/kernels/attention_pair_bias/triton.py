"""The "attention_pair_bias" backend (Triton): the single track's attention on the flash triangle
attention kernel (foldmill.kernels.triangle_attention.triton_kernel)."""

from __future__ import annotations

from torch import Tensor
from torch.nn import functional as F

from foldmill.kernels.registry import compute_dtype
from foldmill.kernels.triangle_attention.triton import HEAD_DIMS
from foldmill.kernels.triton_support import records_autograd


def attention_pair_bias(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, mask: Tensor, inf: float) -> Tensor:
    """The "attention_pair_bias" backend: the single track's attention (one row of queries per record) on
    the flash kernel, heads zero-padded to the next kernel width (24 -> 32: padded dims add nothing to
    the logits, their outputs are dropped). On the H200 at 2,472 tokens the trunk's single-track
    attention (16 heads x 24) took SDPA's math path, in fp32: 1.8 ms of a 147 ms pairformer block.
    Same arguments and result as the reference (q: (B, S, H, D); k, v: (B, K, H, D); bias: (B or 1, H, S, K); mask: (B, K), nonzero = valid); masked keys get the kernel's masked logit instead
    of -inf, which gives every query with a valid key the same softmax. Elsewhere (autograd, heads
    wider than the kernel's) SDPA's backend."""
    head_dim = q.shape[-1]
    width = next((dim for dim in HEAD_DIMS if dim >= head_dim), None)
    if records_autograd(q, k, v, bias) or width is None:
        from foldmill.kernels.attention_pair_bias.sdpa import attention_pair_bias as sdpa_attention

        return sdpa_attention(q, k, v, bias, mask, inf)
    from foldmill.kernels.triangle_attention.triton_kernel import flash_triangle_attention

    dtype = compute_dtype(q)

    def rows_of_heads(t: Tensor) -> Tensor:  # (B, L, H, D) -> (B, 1, H, L, width) in the compute dtype
        return F.pad(t.to(dtype).transpose(1, 2), (0, width - head_dim)).unsqueeze(1)

    key_mask = (mask != 0)[:, None, None, None, :]
    out = flash_triangle_attention(
        rows_of_heads(q), rows_of_heads(k), rows_of_heads(v), bias.unsqueeze(1), key_mask, head_dim**-0.5, dtype
    )
    return out[:, 0, :, :, :head_dim].transpose(1, 2)
