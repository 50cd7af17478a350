"""Flash triangle attention backend (Triton): the core of foldmill.model.layers.triangle_attention
without materialising the (rows x heads x J x J) logits.

Why: on sm_90, cuEquivariance 0.13 falls back to a cuDNN sm80 fp16 64 x 64 kernel for triangle
attention (its fast kernel is Blackwell-only), measured at ~95 TFLOP/s and 35% of the trunk's
GPU time at 1,000 tokens. The kernel (foldmill.kernels.triangle_attention.triton_kernel) reads
q/k/v as the strided views GatedAttention hands over (no copies), the bias once per group of
rows from L2, and keeps the softmax statistics in fp32.

Measured on the H200 (`foldmill bench kernels`, 1 x N rows x 4 heads x 32, bf16): 4.24 ms against
cuEquivariance's 6.82 ms at 1,024 tokens, 2.19 vs 3.11 ms at 768, 0.75 vs 1.14 ms at 512; the shipped
sm_90 table puts it first at every size. With 128 registers per thread and the rows' shared key mask
folded into the bias: 3.77 ms at 1,024 tokens and 44.5 ms at 2,472 on the model's masks.
The "gated_triangle_attention" and "attention_pair_bias" ops run the same kernel (their folders).

Same arguments and result as triangle_attention: the output is (B, I, H, J, D) in the compute
dtype (the autocast dtype, else q's). Triton is imported lazily: this module loads where triton is
absent (CPU CI); `triton_support.available()` is then False. The reference runs here instead for
head dims the kernel does not take (not a power of two in 16..64) and when autograd records (the
kernel has no backward; inference runs under no_grad).
"""

from __future__ import annotations

from torch import Tensor

from foldmill.kernels.registry import compute_dtype
from foldmill.kernels.triton_support import records_autograd

HEAD_DIMS = (16, 32, 64)  # tl.dot needs >= 16; wider heads would need smaller tiles than the candidates


def supported(head_dim: int) -> bool:
    """Whether the kernel takes heads of this width."""
    return head_dim in HEAD_DIMS


def supports(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, mask: Tensor, scale: float) -> bool:
    return not records_autograd(q, k, v, bias) and supported(q.shape[-1])


def triangle_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, mask: Tensor, scale: float) -> Tensor:
    """The registry backend (where `supports_triangle_attention`)."""
    from foldmill.kernels.triangle_attention.triton_kernel import flash_triangle_attention

    return flash_triangle_attention(q, k, v, bias, mask, scale, compute_dtype(q))
