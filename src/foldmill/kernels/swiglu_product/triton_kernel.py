"""The Triton kernel behind the "swiglu_product" op (imports triton: load it lazily):
silu(gates) * x * y over a flat range of output elements."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

SWIGLU_BLOCK = 1024


@triton.jit(do_not_specialize=["elements"])
def _swiglu_product_kernel(h_ptr, out_ptr, elements, inner, h_row_stride, BLOCK: tl.constexpr):
    index = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = index < elements
    start = (index // inner) * h_row_stride + index % inner
    x = tl.load(h_ptr + start, mask=ok, other=0.0).to(tl.float32)
    gates = tl.load(h_ptr + start + inner, mask=ok, other=0.0).to(tl.float32)
    y = tl.load(h_ptr + start + 2 * inner, mask=ok, other=0.0).to(tl.float32)
    out = gates * tl.sigmoid(gates) * x * y
    tl.store(out_ptr + index, out.to(out_ptr.dtype.element_ty), mask=ok)


def swiglu_product(h: Tensor) -> Tensor:
    """See foldmill.model.layers.modulation.swiglu_product; `h` must be contiguous."""
    inner = h.shape[-1] // 3
    out = torch.empty((*h.shape[:-1], inner), device=h.device, dtype=h.dtype)
    elements = out.numel()
    _swiglu_product_kernel[(triton.cdiv(elements, SWIGLU_BLOCK),)](
        h, out, elements, inner, h.shape[-1], BLOCK=SWIGLU_BLOCK, num_warps=4
    )
    return out
