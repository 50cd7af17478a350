"""MXFP8 backend: E4M3 elements with one E8M0 scale per 32 values along each GEMM's contraction dim.

forward  y = x w^T   blocks along K       (x row-wise, w row-wise)
dgrad    dx = dy w   blocks along N       (dy row-wise, w along its N rows)
wgrad    dw = dy^T x blocks along tokens  (dy and x along their rows; expert groups padded to multiples of 32)
Each copy is quantized from the high-precision tensor. Where the GEMMs run (`gemm_route`):
- "block_scaled" (compute capability 10+): the native block-scaled MMA through tl.dot_scaled
  (kernels/mx_grouped_gemm.py).
- "exact_bf16" (Hopper and other CUDA GPUs): E4M3 x 2^k is exact in bf16, so one pass per operand
  writes the exact values of its MXFP8 copy in bf16 and cuBLAS's bf16 grouped GEMM (fp32
  accumulation) multiplies them: the same products as a block-scaled MMA, at bf16 tensor-core speed.
  The weights' copies are made once per optimizer step; x's along-tokens copy for wgrad is made in
  the forward pass and saved as MXFP8 (1 byte + 1/32 scale per value instead of 2). The SwiGLU
  kernels write the copies of their outputs (a, and the gradient of h) themselves
  (`ExactCopies`), so those tensors are never written in full precision and read back.
- "emulated" (CPU): the same steps in torch, float32 GEMMs: the numerical reference.
PyTorch's MXFP8 scaled_grouped_mm is never called: on sm90 it launches an sm100 kernel that poisons the context.

`store_swiglu_input` (`moe.mxfp8_store_swiglu_input`) keeps the SwiGLU's input h, the largest
activation of the expert MLP (rows x 2F), as its MXFP8 copy (blocks along 2F) for the backward
pass, instead of h in bf16 and a's along-rows copy: the backward takes the SwiGLU's gradient at
the values of that copy and computes a again from them for the second GEMM's weight gradient, as
DeepSeek-V3 keeps the SwiGLU's input in FP8. The forward pass and every GEMM's operands stay as
above; only what the backward reads for h changes.

`keep_weight_copies` (`moe.keep_weight_copies`, on by default) keeps the weights' copies from
their first GEMM to the optimizer step. On Hopper they are bf16 values in two layouts, 4 bytes per
expert parameter held through the whole step; off, each GEMM makes the one layout it needs and drops
it after, so the step's peak memory comes near bf16's for one more read of each weight per pass.
The values are the same either way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from foldmill.moe.experts.swiglu import swiglu_backward, swiglu_forward
from foldmill.moe.experts.weights import WeightCache
from foldmill.moe.kernels import compute_capability, use_triton
from foldmill.moe.quant.mx import MXTensor, quantize_mx

BLOCK = 32


def route_for_capability(capability: tuple[int, int] | None) -> str:
    """Which MXFP8 GEMM path a device runs: None (no CUDA+Triton) -> "emulated"."""
    if capability is None:
        return "emulated"
    return "block_scaled" if capability[0] >= 10 else "exact_bf16"


def gemm_route(tensor: torch.Tensor) -> str:
    return route_for_capability(compute_capability(tensor) if use_triton(tensor) else None)


def quantize(values: torch.Tensor) -> MXTensor:
    """MXFP8 along the last dimension (Triton kernel on CUDA, torch elsewhere; bit-identical)."""
    if use_triton(values):
        from foldmill.moe.kernels.mx_quant import quantize_mx_triton

        return quantize_mx_triton(values)
    return quantize_mx(values)


def round_trip(
    values: torch.Tensor, along_cols: bool, along_rows: bool, keep_along_rows: bool = False
) -> tuple[torch.Tensor | None, torch.Tensor | None, MXTensor | None]:
    """Exact values of the MXFP8 copies of `values` with blocks along its columns (last dim) and/or
    along its rows (second-last dim), in bf16 on CUDA (float32 in emulation), and optionally the
    along-rows MXFP8 copy itself (an MXTensor of the transposed view)."""
    if use_triton(values):
        from foldmill.moe.kernels.mx_quant import mx_round_trip_triton

        return mx_round_trip_triton(values, along_cols, along_rows, keep_along_rows, torch.bfloat16)
    transposed = quantize_mx(values.transpose(-2, -1)) if along_rows or keep_along_rows else None
    by_cols = quantize_mx(values).dequantize() if along_cols else None
    by_rows = transposed.dequantize().transpose(-2, -1) if along_rows else None
    return by_cols, by_rows, transposed if keep_along_rows else None


def along_rows_values(mx: MXTensor) -> torch.Tensor:
    """(rows, cols) values of an along-rows copy kept by `round_trip`."""
    if use_triton(mx.data):
        from foldmill.moe.kernels.mx_quant import dequantize_along_rows_triton

        return dequantize_along_rows_triton(mx, torch.bfloat16)
    return mx.dequantize().transpose(-2, -1)


def mx_grouped_mm(a: MXTensor, b: MXTensor, ends: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """(rows, N) = a_e b_e^T per group: a (rows, K), b (experts, N, K), both blocked along K."""
    if use_triton(a.data):
        from foldmill.moe.kernels.mx_grouped_gemm import mx_grouped_mm_triton

        return mx_grouped_mm_triton(a, b, ends, out_dtype)
    return F.grouped_mm(a.dequantize(), b.dequantize().transpose(-2, -1), offs=ends).to(out_dtype)


def mx_grouped_mm_wgrad(a: MXTensor, b: MXTensor, ends: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """(experts, N, K) = a[:, group] b[:, group]^T: a (N, rows), b (K, rows), both blocked along rows."""
    if use_triton(a.data):
        from foldmill.moe.kernels.mx_grouped_gemm import mx_grouped_mm_wgrad_triton

        return mx_grouped_mm_wgrad_triton(a, b, ends, out_dtype)
    return F.grouped_mm(a.dequantize(), b.dequantize().t(), offs=ends).to(out_dtype)


def _weight_copies(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact values of w's MXFP8 copies blocked along K (forward) and along N (dgrad), from one read."""
    along_k, along_n, _ = round_trip(weight, along_cols=True, along_rows=True)
    return along_k, along_n


@dataclass
class ExactCopies:
    """An activation handed to the next GEMM as the exact values of its MXFP8 copies, made by the
    kernel that produced it: blocks along its columns (the next GEMM's contraction), and either
    blocks along its rows as values (a gradient, for wgrad) or as the MXFP8 copy kept for wgrad."""

    along_cols: torch.Tensor
    along_rows: torch.Tensor | None
    kept: MXTensor | None
    dtype: torch.dtype


def input_copies(x: torch.Tensor) -> ExactCopies:
    """A GEMM input's copies (values blocked along K, the along-rows copy kept for wgrad) in one pass."""
    values, _, kept = round_trip(x, along_cols=True, along_rows=False, keep_along_rows=True)
    return ExactCopies(values, None, kept, x.dtype)


def gradient_copies(dy: torch.Tensor) -> ExactCopies:
    """An output gradient's copies (values blocked along N for dgrad, along the rows for wgrad) in one pass."""
    along_cols, along_rows, _ = round_trip(dy, along_cols=True, along_rows=True)
    return ExactCopies(along_cols, along_rows, None, dy.dtype)


@dataclass
class StoredSwiGLUInput:
    """The SwiGLU's input h kept for the backward pass as its MXFP8 copy (blocks along 2F), with
    the routing weights that a = SwiGLU(h, p) is computed again from (`store_swiglu_input`)."""

    h: MXTensor
    row_probs: torch.Tensor
    dtype: torch.dtype

    def values(self) -> torch.Tensor:
        """h's exact values in this copy, as `dtype` (E4M3 x 2^k is exact in bf16)."""
        return self.h.dequantize(self.dtype)


@dataclass
class StoredSwiGLUOutput:
    """SwiGLU's output in the form the second GEMM takes, and what its backward keeps instead."""

    operand: object
    stored: StoredSwiGLUInput


def swiglu_forward_copies(h: torch.Tensor, row_probs: torch.Tensor) -> ExactCopies:
    """SwiGLU's output a as `input_copies` would give it, written by the SwiGLU kernel itself."""
    if use_triton(h):
        from foldmill.moe.kernels.swiglu import swiglu_forward_mx_triton

        values, kept = swiglu_forward_mx_triton(h, row_probs)
        return ExactCopies(values, None, kept, h.dtype)
    return input_copies(swiglu_forward(h, row_probs))


def swiglu_input_values(h: torch.Tensor | StoredSwiGLUInput) -> torch.Tensor:
    """h itself, or the values of its stored MXFP8 copy."""
    return h.values() if isinstance(h, StoredSwiGLUInput) else h


def swiglu_forward_storing_input(h: torch.Tensor, row_probs: torch.Tensor) -> StoredSwiGLUOutput:
    """a's values blocked along F (for the second GEMM) and h's MXFP8 copy, in one pass over h."""
    if use_triton(h):
        from foldmill.moe.kernels.swiglu import swiglu_forward_mx_triton

        values, h_mx = swiglu_forward_mx_triton(h, row_probs, store_input=True)
    else:
        values, _, _ = round_trip(swiglu_forward(h, row_probs), along_cols=True, along_rows=False)
        h_mx = quantize_mx(h)
    return StoredSwiGLUOutput(ExactCopies(values, None, None, h.dtype), StoredSwiGLUInput(h_mx, row_probs, h.dtype))


def stored_swiglu_along_rows(stored: StoredSwiGLUInput) -> torch.Tensor:
    """Values of the along-rows MXFP8 copy of a, computed again from h's stored copy (the second
    GEMM's weight-gradient operand)."""
    if use_triton(stored.h.data):
        from foldmill.moe.kernels.swiglu import swiglu_along_rows_from_stored_triton

        return swiglu_along_rows_from_stored_triton(stored.h, stored.row_probs, stored.dtype)
    _, along_rows, _ = round_trip(swiglu_forward(stored.values(), stored.row_probs), along_cols=False,
                                  along_rows=True)
    return along_rows


def swiglu_backward_copies(
    h: torch.Tensor | StoredSwiGLUInput, row_probs: torch.Tensor, grad_a: torch.Tensor
) -> tuple[ExactCopies, torch.Tensor]:
    """(grad_h as `gradient_copies` would give it, written by the SwiGLU backward kernel itself;
    grad_row_probs). h is the SwiGLU's input, or its stored MXFP8 copy."""
    if use_triton(grad_a):
        from foldmill.moe.kernels.swiglu import swiglu_backward_mx_triton

        h_operand = h.h if isinstance(h, StoredSwiGLUInput) else h
        along_cols, along_rows, grad_probs = swiglu_backward_mx_triton(h_operand, row_probs, grad_a)
        return ExactCopies(along_cols, along_rows, None, grad_a.dtype), grad_probs
    grad_h, grad_probs = swiglu_backward(swiglu_input_values(h), row_probs, grad_a)
    return gradient_copies(grad_h), grad_probs


class MXFP8Gemm:
    name = "mxfp8"
    pad_multiple = BLOCK
    nonempty_groups = False

    def __init__(self, store_swiglu_input: bool = False, keep_weight_copies: bool = True) -> None:
        self.weights = WeightCache() if keep_weight_copies else None
        self.store_swiglu_input = store_swiglu_input

    def _weight_copy(self, layout: str, w: torch.Tensor) -> torch.Tensor | MXTensor:
        """w's copy for the forward GEMM (blocks along K) or for dgrad (along N): MXFP8 on the
        block-scaled route, else its exact values; kept for the optimizer step, or made for this call."""
        if gemm_route(w) == "block_scaled":
            make = quantize if layout == "forward" else lambda t: quantize(t.transpose(-2, -1))
            return make(w) if self.weights is None else self.weights.get(layout, w, make)
        if self.weights is not None:  # both layouts from one read, for the rest of the step
            along_k, along_n = self.weights.get("copies", w, _weight_copies)
        else:
            along_k, along_n, _ = round_trip(w, along_cols=layout == "forward", along_rows=layout == "dgrad")
        return along_k if layout == "forward" else along_n

    def swiglu_forward(self, h, row_probs):
        block_scaled = gemm_route(h) == "block_scaled"
        if self.store_swiglu_input:
            if block_scaled:
                stored = StoredSwiGLUInput(quantize(h), row_probs, h.dtype)
                return StoredSwiGLUOutput(swiglu_forward(h, row_probs), stored)
            return swiglu_forward_storing_input(h, row_probs)
        return swiglu_forward(h, row_probs) if block_scaled else swiglu_forward_copies(h, row_probs)

    @staticmethod
    def saved_swiglu_input(h, a_saved):
        """What the backward reads for h: its stored copy, which the second GEMM's `saved` carries."""
        return a_saved if isinstance(a_saved, StoredSwiGLUInput) else h

    def swiglu_backward(self, h, row_probs, grad_a):
        if gemm_route(grad_a) == "block_scaled":
            return swiglu_backward(swiglu_input_values(h), row_probs, grad_a)
        return swiglu_backward_copies(h, row_probs, grad_a)

    def forward(self, x, w, ends):
        if isinstance(x, StoredSwiGLUOutput):  # the second GEMM keeps h's copy instead of a's
            return self.forward(x.operand, w, ends)[0], x.stored
        if not isinstance(x, ExactCopies):  # ExactCopies come from this backend's SwiGLU
            if gemm_route(x) == "block_scaled":
                return mx_grouped_mm(quantize(x), self._weight_copy("forward", w), ends, x.dtype), x
            x = input_copies(x)
        w_values = self._weight_copy("forward", w)
        return F.grouped_mm(x.along_cols, w_values.transpose(-2, -1), offs=ends).to(x.dtype), x.kept

    def backward(self, dy, w, saved, ends):
        if not isinstance(dy, ExactCopies):
            if gemm_route(dy) == "block_scaled":
                dx = mx_grouped_mm(quantize(dy), self._weight_copy("dgrad", w), ends, dy.dtype)
                if isinstance(saved, StoredSwiGLUInput):
                    saved = swiglu_forward(saved.values(), saved.row_probs)
                return dx, mx_grouped_mm_wgrad(quantize(dy.t()), quantize(saved.t()), ends, dy.dtype)
            dy = gradient_copies(dy)
        dx = F.grouped_mm(dy.along_cols, self._weight_copy("dgrad", w), offs=ends).to(dy.dtype)
        saved_values = (stored_swiglu_along_rows(saved) if isinstance(saved, StoredSwiGLUInput)
                        else along_rows_values(saved))
        dw = F.grouped_mm(dy.along_rows.t(), saved_values, offs=ends).to(dy.dtype)
        return dx, dw
