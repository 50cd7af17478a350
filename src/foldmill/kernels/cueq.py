"""Whether NVIDIA cuEquivariance (`cuequivariance_torch` + its CUDA ops package) can run here; its backends
live in the folders of their ops (triangle_multiplication/cueq.py, triangle_attention/cueq.py) and import it lazily.

`available()` is False (never an exception) where the ops package is missing, e.g. on CPU
machines that only carry cuequivariance-torch. The ops keep their own conventions: triangle
attention takes an fp32 bias (cast here); triangle multiplication reads fp32 weights and, under
bf16 autocast, runs its matrix products in bf16 with fp32 LayerNorms.
"""

from __future__ import annotations

import functools


@functools.cache
def available() -> bool:
    try:
        import cuequivariance_ops_torch  # noqa: F401
        import cuequivariance_torch  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means "not here"
        return False
    return True
