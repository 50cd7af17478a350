"""Flash triangle attention backend (Triton): the core of foldmill.model.layers.triangle_attention
without materialising the (rows x heads x J x J) logits.

Why: on sm_90, cuEquivariance 0.13 falls back to a cuDNN sm80 fp16 64 x 64 kernel for triangle
attention (its fast kernel is Blackwell-only), measured at ~95 TFLOP/s and 35% of the trunk's
GPU time at 1,000 tokens. The kernel (foldmill.kernels.triton_triangle_attention_kernel) reads
q/k/v as the strided views GatedAttention hands over (no copies), the bias once per group of
rows from L2, and keeps the softmax statistics in fp32.

Measured on the H200 (`foldmill bench kernels`, 1 x N rows x 4 heads x 32, bf16): 4.24 ms against
cuEquivariance's 6.82 ms at 1,024 tokens, 2.19 vs 3.11 ms at 768, 0.75 vs 1.14 ms at 512; the shipped
sm_90 table puts it first at every size. Since session 9 (128 registers per thread, the rows' shared
key mask folded into the bias): 3.77 ms at 1,024 tokens and 44.5 ms at 2,472 on the model's masks.
`gated_triangle_attention` is the same kernel with the
output gate of GatedAttention fused into its store (sigmoid(gate) * out in the (B, I, J, H*D) layout
the output projection reads): at 1,700 tokens the separate sigmoid, strided multiply and chunk
copies it replaces were 0.5 of a 5.6 s trunk pass.

Same arguments and result as triangle_attention_core: the output is (B, I, H, J, D) in the compute
dtype (the autocast dtype, else q's). Triton is imported lazily: this module loads where triton is
absent (CPU CI); `triton_support.available()` is then False. The reference runs here instead for
head dims the kernel does not take (not a power of two in 16..64) and when autograd records (the
kernel has no backward; inference runs under no_grad).
"""

from __future__ import annotations

from torch import Tensor
from torch.nn import functional as F

from foldmill.kernels.registry import compute_dtype
from foldmill.kernels.triton_support import records_autograd

HEAD_DIMS = (16, 32, 64)  # tl.dot needs >= 16; wider heads would need smaller tiles than the candidates


def supported(head_dim: int) -> bool:
    """Whether the kernel takes heads of this width."""
    return head_dim in HEAD_DIMS


def supports_triangle_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, mask: Tensor, scale: float) -> bool:
    return not records_autograd(q, k, v, bias) and supported(q.shape[-1])


def triangle_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, mask: Tensor, scale: float) -> Tensor:
    """The registry backend (where `supports_triangle_attention`)."""
    from foldmill.kernels.triton_triangle_attention_kernel import flash_triangle_attention

    return flash_triangle_attention(q, k, v, bias, mask, scale, compute_dtype(q))


def supports_gated_triangle_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor,
    mask: Tensor,
    scale: float,
    gate: Tensor,
    chunk_size: int | None,
    prepared: dict | None = None,
) -> bool:
    """Where the registry runs the flash kernel for the attention itself (elsewhere the reference, which
    dispatches the attention per chunk)."""
    from foldmill.kernels.registry import select

    return (
        not records_autograd(q, k, v, bias, gate)
        and supported(q.shape[-1])
        and select("triangle_attention", q, q.shape[-2]) == "triton"
    )


def gated_triangle_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor,
    mask: Tensor,
    scale: float,
    gate: Tensor,
    chunk_size: int | None,
    prepared: dict | None = None,
) -> Tensor:
    """The "gated_triangle_attention" backend: the flash kernel with the output gate fused into its
    store, unchunked (it never makes the logits that chunks bound), where
    `supports_gated_triangle_attention`. `prepared`: see flash_triangle_attention."""
    from foldmill.kernels.triton_triangle_attention_kernel import flash_triangle_attention

    return flash_triangle_attention(q, k, v, bias, mask, scale, compute_dtype(q), gate=gate, prepared=prepared)


def attention_with_pair_bias(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, mask: Tensor, inf: float) -> Tensor:
    """The "attention_pair_bias" backend: the single track's attention (one row of queries per record) on
    the flash kernel, heads zero-padded to the next kernel width (24 -> 32: padded dims add nothing to
    the logits, their outputs are dropped). On the H200 at 2,472 tokens the trunk's single-track
    attention (16 heads x 24) took SDPA's math path, in fp32: 1.8 ms of a 147 ms pairformer block
    (session 12). Same arguments and result as the reference (q: (B, S, H, D); k, v: (B, K, H, D); bias:
    (B or 1, H, S, K); mask: (B, K), nonzero = valid); masked keys get the kernel's masked logit instead
    of -inf, which gives every query with a valid key the same softmax. Elsewhere (autograd, heads
    wider than the kernel's) SDPA's backend."""
    head_dim = q.shape[-1]
    width = next((dim for dim in HEAD_DIMS if dim >= head_dim), None)
    if records_autograd(q, k, v, bias) or width is None:
        from foldmill.kernels.sdpa import attention_with_pair_bias as sdpa_attention

        return sdpa_attention(q, k, v, bias, mask, inf)
    from foldmill.kernels.triton_triangle_attention_kernel import flash_triangle_attention

    dtype = compute_dtype(q)

    def rows_of_heads(t: Tensor) -> Tensor:  # (B, L, H, D) -> (B, 1, H, L, width) in the compute dtype
        return F.pad(t.to(dtype).transpose(1, 2), (0, width - head_dim)).unsqueeze(1)

    key_mask = (mask != 0)[:, None, None, None, :]
    out = flash_triangle_attention(
        rows_of_heads(q), rows_of_heads(k), rows_of_heads(v), bias.unsqueeze(1), key_mask, head_dim**-0.5, dtype
    )
    return out[:, 0, :, :, :head_dim].transpose(1, 2)
