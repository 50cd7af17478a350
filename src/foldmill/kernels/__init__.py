"""Kernel selection for the Boltz-2 model's hot ops (see foldmill.kernels.registry).

    from foldmill import kernels
    kernels.register_reference("triangle_attention", triangle_attention)  # done by foldmill.model
    out = kernels.dispatch("triangle_attention", q, k, v, bias, mask, scale)
    with kernels.kernel_policy(enabled=False): ...          # the plain PyTorch reference everywhere
    with kernels.kernel_policy(force={"triangle_attention": "sdpa"}): ...

Each op has a folder here with its registration, backends and Triton kernels; foldmill.kernels.ops is
the index. The choice per GPU architecture, dtype and size comes from a measured crossover table
(crossover_sm90.json; `foldmill bench kernels` re-measures it).
"""

from foldmill.kernels import ops  # noqa: F401 - registers the ops and their backends
from foldmill.kernels.registry import (
    REFERENCE,
    backend_names,
    call_backend,
    chosen_counts,
    dispatch,
    kernel_policy,
    load_backends,
    register_reference,
    reset_counts,
    retired_backends,
    select,
)

__all__ = [
    "REFERENCE",
    "backend_names",
    "call_backend",
    "chosen_counts",
    "dispatch",
    "kernel_policy",
    "load_backends",
    "register_reference",
    "reset_counts",
    "retired_backends",
    "select",
]
