"""A cast to the compute dtype whose backward converts the gradient back in a vectorized kernel.

Under the bf16-mixed recipe the experts' float32 weights are cast to bf16 for every pass, and the
gradient of that cast is the bf16 weight gradient converted to float32. torch converts bf16 to
float32 in its generic dtype-converting copy, one element per thread without vector loads; this
kernel loads and stores whole vectors. The conversion is exact, so the gradients are the same bits.
On the H200: 0.205 ms instead of 0.375 for one bio_8x1b layer's w13 gradient (8 x 8,192 x 2,048),
0.028 instead of 0.050 for an 8,192 x 2,048 activation's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from foldmill.moe.kernels.grid import cdiv


@triton.jit
def _upcast_kernel(src_ptr, dst_ptr, numel, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask).to(dst_ptr.dtype.element_ty), mask=mask)


_BLOCK, _WARPS = 4096, 4


def upcast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t converted to the wider float `dtype`: by the kernel when t is contiguous, else by torch."""
    if not t.is_contiguous():
        return t.to(dtype)
    out = torch.empty_like(t, dtype=dtype)
    if t.numel():
        _upcast_kernel[(cdiv(t.numel(), _BLOCK),)](t, out, t.numel(), BLOCK=_BLOCK, num_warps=_WARPS)
    return out


class CastForCompute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t, dtype):
        ctx.source_dtype = t.dtype
        return t.to(dtype)

    @staticmethod
    def backward(ctx, grad):
        return upcast(grad, ctx.source_dtype), None


def cast_for_compute_triton(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t (float32, CUDA) as `dtype` (bf16 or fp16), its gradient converted back by `upcast`."""
    return CastForCompute.apply(t, dtype)
