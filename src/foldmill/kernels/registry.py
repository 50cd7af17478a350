"""Per-call choice among the implementations ("backends") of the model's hot ops.

An op has a plain PyTorch reference, registered by the model that defines it
(`register_reference(op, fn)`, so this package never imports the model), and optional backends
with the reference's exact signature, each declaring which arguments it takes (`Backend.supports`).
`dispatch(op, *args)` picks one from the device, the compute dtype (the autocast dtype when
autocast is on) and the number of tokens, then calls it, or the reference where the picked
backend does not take these arguments:

- CPU (or kernels disabled by `kernel_policy(enabled=False)`): the reference, always;
- CUDA: the backend order of the crossover table measured for that GPU architecture
  (`crossover_sm90.json`, see foldmill.kernels.crossover) at the nearest measured size; the
  first available backend in that order runs. Without a table for the architecture, the op's
  default order (`OpSpec.default_order`, set in the op's folder) is used.

A backend that turns out to be unusable at run time (its ops library missing, "Not
Supported") is retired for the process with one warning and the next one runs; any other
error propagates. `kernel_policy(force={op: backend})` pins a backend (tests, benchmarks).
`chosen_counts()` tells which backend served how many calls.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from foldmill.kernels import crossover

REFERENCE = "reference"
CUDA = frozenset({"cuda"})
CPU_AND_CUDA = frozenset({"cpu", "cuda"})
HALF = frozenset({torch.bfloat16, torch.float16})
FLOAT = frozenset({torch.bfloat16, torch.float16, torch.float32})


def second_to_last_axis(x: Tensor, *args: object, **kwargs: object) -> int:
    """Tokens of an op on (..., N, C) rows: the pair track (B, N, N, C), the single track (B, N, C)."""
    return x.shape[-2] if x.dim() >= 2 else 1


@dataclass(frozen=True)
class Backend:
    """One implementation of an op: runs on `devices` for `dtypes` when `available()` says so."""

    name: str
    fn: Callable[..., Tensor]
    devices: frozenset[str]
    dtypes: frozenset[torch.dtype]
    available: Callable[[], bool] = lambda: True
    supports: Callable[..., bool] = lambda *args, **kwargs: True  # takes these arguments (else the reference runs)


@dataclass(frozen=True)
class OpSpec:
    """How to read the token count off an op's arguments, its non-reference backends, and the backend
    order per compute dtype name where no measured table covers the GPU (the reference ends every order)."""

    tokens: Callable[..., int]
    backends: tuple[Backend, ...] = ()
    default_order: Mapping[str, list[str]] = field(default_factory=dict)


def half_precision_order(*names: str) -> dict[str, list[str]]:
    """A default order running `names` in bf16 and fp16, the reference in fp32."""
    return {"bfloat16": [*names, REFERENCE], "float16": [*names, REFERENCE], "float32": [REFERENCE]}


@dataclass(frozen=True)
class KernelPolicy:
    enabled: bool = True
    force: Mapping[str, str] = field(default_factory=dict)


_DEFAULT_POLICY = KernelPolicy()
_policy: ContextVar[KernelPolicy] = ContextVar("foldmill_kernel_policy", default=_DEFAULT_POLICY)
_ops: dict[str, OpSpec] = {}
_references: dict[str, Callable[..., Any]] = {}
_retired: dict[tuple[str, str], str] = {}  # (op, backend) -> why it was retired
_choices: dict[tuple, str] = {}  # select()'s choices, cleared whenever a backend is retired
_counts: Counter[tuple[str, str]] = Counter()

def register_op(name: str, spec: OpSpec) -> None:
    _ops[name] = spec
    _choices.clear()


def register_reference(op: str, fn: Callable[..., Any]) -> None:
    """The plain PyTorch implementation of `op`: what runs on CPU, with kernels off, and wherever the
    chosen backend does not take the arguments."""
    _references[op] = fn


def reference(op: str) -> Callable[..., Any]:
    try:
        return _references[op]
    except KeyError:
        raise LookupError(f"kernel op {op!r} has no registered reference (import the model module defining it)") from None


def call_backend(op: str, name: str, *args: Any, **kwargs: Any) -> Any:
    """Backend `name` of `op` on these arguments where it takes them, else the op's reference."""
    if name != REFERENCE:
        backend = next(backend for backend in _ops[op].backends if backend.name == name)
        if backend.supports(*args, **kwargs):
            return backend.fn(*args, **kwargs)
    return reference(op)(*args, **kwargs)


def load_backends(device: torch.device | str, dtypes: Iterable[torch.dtype]) -> list[str]:
    """Import the backends the registry picks first on `device`, for each op, compute dtype in `dtypes`
    (the runner's) and size row of the op's table (each `available()` imports its package): a replica
    pays those imports at start-up, not inside its first target, and pays none for a backend it would
    not run. (cuEquivariance's import, which pulls in torch._dynamo, sympy and scipy, took 8-9 s of a
    replica's start-up on the H200.) Returns the op/backend names loaded."""
    device = torch.device(device)
    arch = _arch(device) if device.type == "cuda" else None
    loaded = set()
    for op in _ops:
        for dtype in dtypes:
            for num_tokens in _row_sizes(arch, op, dtype):
                name = _first_usable(op, device.type, arch, dtype, num_tokens, _policy.get())
                if name != REFERENCE:
                    loaded.add(f"{op}/{name}")
    return sorted(loaded)


def _row_sizes(arch: str | None, op: str, dtype: torch.dtype) -> list[int]:
    """A token count in each row of the op's measured table (one, any, without a table)."""
    rows = crossover.rows(arch, op, str(dtype).removeprefix("torch.")) if arch else []
    return [row["max_tokens"] or 1 << 30 for row in rows] or [1]


def backend_names(op: str) -> list[str]:
    return [REFERENCE, *(backend.name for backend in _ops[op].backends)]


@contextmanager
def kernel_policy(enabled: bool = True, force: Mapping[str, str] | None = None) -> Iterator[KernelPolicy]:
    """Within the block, kernels are on/off; `force` pins backends by op name."""
    for op, name in (force or {}).items():
        if op not in _ops or name not in backend_names(op):
            raise ValueError(f"unknown op/backend {op}/{name}; known: { {o: backend_names(o) for o in _ops} }")
    policy = KernelPolicy(enabled, dict(force or {}))
    token = _policy.set(policy)
    try:
        yield policy
    finally:
        _policy.reset(token)


def compute_dtype(x: Tensor) -> torch.dtype:
    """The dtype matrix products of `x` run in: the autocast dtype if autocast is on for its device."""
    device_type = x.device.type
    if device_type in ("cuda", "cpu") and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return x.dtype


def _arch(device: torch.device) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def _usable(op: str, backend: Backend, device_type: str, dtype: torch.dtype) -> bool:
    return (
        device_type in backend.devices
        and dtype in backend.dtypes
        and (op, backend.name) not in _retired
        and backend.available()
    )


def candidate_order(
    op: str, device_type: str, arch: str | None, dtype: torch.dtype, num_tokens: int, policy: KernelPolicy
) -> list[str]:
    """Backends to try in order, before availability is checked (the reference always ends the list)."""
    if op in policy.force:
        order = [policy.force[op]]
    elif not policy.enabled or device_type != "cuda":
        order = []
    else:
        dtype_name = str(dtype).removeprefix("torch.")
        order = crossover.order(arch, op, dtype_name, num_tokens) if arch else None
        if order is None:
            order = _ops[op].default_order.get(dtype_name, [])
    return list(order) if REFERENCE in order else [*order, REFERENCE]


def select(op: str, x: Tensor, num_tokens: int) -> str:
    """Name of the backend that runs `op` for an input like `x` with `num_tokens` tokens."""
    policy = _policy.get()
    dtype = compute_dtype(x)
    device_type = x.device.type
    key = (op, device_type, x.device.index, dtype, num_tokens, policy.enabled, tuple(sorted(policy.force.items())))
    if key not in _choices:
        arch = _arch(x.device) if device_type == "cuda" else None
        _choices[key] = _first_usable(op, device_type, arch, dtype, num_tokens, policy)
    return _choices[key]


def _first_usable(
    op: str, device_type: str, arch: str | None, dtype: torch.dtype, num_tokens: int, policy: KernelPolicy
) -> str:
    """The first backend of the candidate order that can run (the reference ends every order). Later
    candidates are not checked, so their packages are not imported."""
    backends = {backend.name: backend for backend in _ops[op].backends}
    return next(
        name
        for name in candidate_order(op, device_type, arch, dtype, num_tokens, policy)
        if name == REFERENCE or (name in backends and _usable(op, backends[name], device_type, dtype))
    )


def _retire(op: str, name: str, error: BaseException) -> None:
    _retired[(op, name)] = f"{type(error).__name__}: {error}"
    _choices.clear()
    warnings.warn(f"kernel {op}/{name} unavailable, falling back: {_retired[(op, name)]}", RuntimeWarning, stacklevel=3)


def _recoverable(error: BaseException) -> bool:
    """Errors that mean "this backend cannot run here", not "this call is wrong"."""
    return isinstance(error, ImportError) or "Not Supported" in str(error) or "Failed to import" in str(error)


def dispatch(op: str, *args: Any, **kwargs: Any) -> Tensor:
    """Run `op` through the selected backend (the arguments of the op's reference); calls the
    reference where that backend does not take these arguments (counted as the reference's)."""
    spec = _ops[op]
    while True:
        name = select(op, args[0], spec.tokens(*args, **kwargs))
        backend = next((backend for backend in spec.backends if backend.name == name), None)
        if backend is None or not backend.supports(*args, **kwargs):
            _counts[(op, REFERENCE)] += 1
            return reference(op)(*args, **kwargs)
        _counts[(op, name)] += 1
        try:
            return backend.fn(*args, **kwargs)
        except Exception as error:  # only "cannot run here" errors are absorbed
            if not _recoverable(error):
                raise
            _retire(op, name, error)


def chosen_counts() -> dict[str, int]:
    """Calls served so far, keyed "op/backend" (reset with `reset_counts`)."""
    return {f"{op}/{name}": count for (op, name), count in sorted(_counts.items())}


def reset_counts() -> None:
    _counts.clear()


def retired_backends() -> dict[str, str]:
    return {f"{op}/{name}": why for (op, name), why in _retired.items()}
