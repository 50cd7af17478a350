"""Launch-grid arithmetic for the kernels' host code, in plain Python.

triton.cdiv and triton.next_power_of_2 are Triton constexpr functions: called from host code, each
call goes through Triton's argument unwrapping, 1.7-1.8 us against 0.06 us for these. The host code
of an eager bio_8x1b step called them 1,575 times (FP8) or 807 times (bf16), and steps launched from
Python wait on their host (docs/benchmarks/moe.md, `--sections host`).
"""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for positive b, as triton.cdiv."""
    return (a + b - 1) // b


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n, as triton.next_power_of_2 (0 for n = 0)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0
