"""Triton device functions shared by foldmill's kernels (imports triton: load it lazily): dot operands
rounded like the tensor cores round them, also under Triton's CPU interpreter."""

import triton
import triton.language as tl


@triton.jit
def rounded(value, DTYPE: tl.constexpr, EMULATE_BF16: tl.constexpr):
    """An fp32 tile rounded to the dot operand dtype.

    EMULATE_BF16 is for Triton's CPU interpreter only, whose bf16 casts truncate and whose dots
    multiply bf16 bit patterns: round to nearest even on the fp32 bits and stay fp32 (exact
    products, fp32 sums: what the tensor cores do with bf16 operands).
    """
    if EMULATE_BF16:
        bits = value.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)
    return value.to(DTYPE)


@triton.jit
def dot_operand(value, EMULATE_BF16: tl.constexpr):
    """A loaded weight tile as a dot operand (upcast exactly under EMULATE_BF16, see rounded)."""
    if EMULATE_BF16:
        return value.to(tl.float32)
    return value
