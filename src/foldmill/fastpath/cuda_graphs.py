"""CUDA graphs of one module call with static shapes: capture once per input shape, replay per step.

Built for the diffusion score model: 200 steps x (24 transformer + 6 atom layers) of small
kernels are launch-bound below ~1,000 tokens. `GraphedCall(fn)` wraps `fn(*tensors_or_dicts)`:

- a call's inputs are tensors, dicts of tensors or dataclasses of tensors; their shapes and dtypes
  (plus any extra key) select the graph (exact-shape buckets), kept in an LRU of at most
  `capacity` graphs; evicted graphs free their memory;
- the first call of a shape runs eagerly while recording which dict entries `fn` reads, then
  captures. Inputs marked `per_call` (new values every call: the noisy coordinates) are copied
  into graph-owned static buffers, at capture and before every replay. The others (the sampling
  run's conditioning and features: the token transformer's bias alone is 1.4 GiB at 1,000 tokens
  in bf16) are read in place, never copied: the graph records their addresses, so a replay is
  only correct while the same memory holds them. Every call therefore compares the addresses
  (and strides) of the in-place tensors fn reads with those captured; on a mismatch (a new
  sampling run whose tensors live elsewhere) the stale graph is dropped and the shape captured
  again. A replay never reads memory the caller has freed: it only happens while the caller
  passes live tensors at exactly the captured addresses;
- memory guard: no capture when less than `min_free_bytes` would stay free, or when the graphs
  already hold `budget_bytes` (static buffers and graph pools; in-place inputs are the caller's);
  capture failures and refused captures run eagerly from then on.

The returned tensor is the graph's static output: consume it before the next call.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import torch
from torch import Tensor


class _RecordingDict(dict):
    """A dict that remembers which keys were read."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        self.read.add(key)  # type: ignore[arg-type]
        return super().__contains__(key)


def _signature(value: Any) -> Hashable:
    if isinstance(value, Tensor):
        return (tuple(value.shape), value.dtype, value.device)
    if isinstance(value, dict):
        return tuple((key, _signature(item)) for key, item in sorted(value.items()))
    if dataclasses.is_dataclass(value):
        return tuple((f.name, _signature(getattr(value, f.name))) for f in dataclasses.fields(value))
    return value


def _addresses(value: Any, keys: set[str] | None = None) -> Hashable:
    """Where the tensors of an in-place input live: data pointers and strides (shapes are in the key)."""
    if isinstance(value, Tensor):
        return (value.data_ptr(), value.stride())
    if isinstance(value, dict):
        return tuple((key, _addresses(value[key])) for key in sorted(value if keys is None else keys))
    if dataclasses.is_dataclass(value):
        return tuple(_addresses(getattr(value, f.name)) for f in dataclasses.fields(value))
    return None


def _static_copy(value: Any, keys: set[str] | None = None) -> Any:
    if isinstance(value, Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {key: item.clone() for key, item in value.items() if keys is None or key in keys}  # read keys only
    if dataclasses.is_dataclass(value):
        return dataclasses.replace(value, **{f.name: getattr(value, f.name).clone() for f in dataclasses.fields(value)})
    return value


def _load(static: Any, value: Any) -> None:
    if isinstance(static, Tensor):
        static.copy_(value)
    elif isinstance(static, dict):
        for key, buffer in static.items():
            buffer.copy_(value[key])
    elif dataclasses.is_dataclass(static):
        for f in dataclasses.fields(static):
            getattr(static, f.name).copy_(getattr(value, f.name))


def _nbytes(value: Any) -> int:
    if isinstance(value, Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_nbytes(item) for item in value.values())
    if dataclasses.is_dataclass(value):
        return sum(_nbytes(getattr(value, f.name)) for f in dataclasses.fields(value))
    return 0


@dataclasses.dataclass
class _Entry:
    graph: torch.cuda.CUDAGraph
    inputs: list[Any]  # per-call inputs: static buffers; others: the caller's values read at capture
    read_keys: list[set[str] | None]  # per input, the dict keys fn reads (None: not a dict)
    addresses: Hashable  # _addresses of the in-place inputs at capture
    output: Tensor
    nbytes: int


class GraphedCall:
    """`fn` replayed from CUDA graphs per input shape (see the module docstring)."""

    def __init__(
        self,
        fn: Callable[..., Tensor],
        per_call: tuple[bool, ...],
        capacity: int = 4,
        min_free_bytes: int = 8 << 30,
        budget_bytes: int = 16 << 30,
    ) -> None:
        self.fn = fn
        self.per_call = per_call
        self.capacity = capacity
        self.min_free_bytes = min_free_bytes
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()
        self._eager: dict[Hashable, str] = {}  # shape key -> why it runs eagerly
        self.captures = 0
        self.replays = 0

    def in_place_addresses(self, inputs: tuple[Any, ...], read_keys: list[set[str] | None]) -> Hashable:
        """The addresses a graph captured from `inputs` reads in place (the inputs not marked per_call)."""
        return tuple(
            _addresses(value, keys) if not per_call else None
            for value, keys, per_call in zip(inputs, read_keys, self.per_call)
        )

    @property
    def eager_reasons(self) -> dict[str, str]:
        return {str(key): why for key, why in self._eager.items()}

    def __len__(self) -> int:
        """Graphs held now."""
        return len(self._entries)

    def clear(self) -> None:
        """Drop every graph: their memory pools and static buffers return to PyTorch's caching
        allocator (no empty_cache: that would synchronise), and the in-place inputs they read are
        no longer kept alive by them."""
        self._entries.clear()

    def __call__(self, *inputs: Any, key: Hashable = None) -> Tensor:
        shape_key = (key, tuple(_signature(value) for value in inputs))
        entry = self._entries.get(shape_key)
        if entry is not None and self.in_place_addresses(inputs, entry.read_keys) != entry.addresses:
            del self._entries[shape_key]  # stale: it reads where the previous run's tensors were
            entry = None
        if entry is None:
            if shape_key in self._eager:
                return self.fn(*inputs)
            entry = self._capture(shape_key, inputs)
            if entry is None:
                return self.fn(*inputs)
        self._entries.move_to_end(shape_key)
        for static, value, per_call in zip(entry.inputs, inputs, self.per_call):
            if per_call:
                _load(static, value)
        entry.graph.replay()
        self.replays += 1
        return entry.output

    def _capture(self, shape_key: Hashable, inputs: tuple[Any, ...]) -> _Entry | None:
        recorded = [_RecordingDict(value) if isinstance(value, dict) else value for value in inputs]
        self.fn(*recorded)  # eager: the result of this call, and the dict keys fn reads
        read_keys = [value.read if isinstance(value, _RecordingDict) else None for value in recorded]
        static = [
            _static_copy(value, keys) if per_call else value
            for value, keys, per_call in zip(inputs, read_keys, self.per_call)
        ]
        static_bytes = _nbytes([value for value, per_call in zip(static, self.per_call) if per_call])
        held = sum(entry.nbytes for entry in self._entries.values())
        free, _ = torch.cuda.mem_get_info()
        if free - static_bytes < self.min_free_bytes or held + static_bytes > self.budget_bytes:
            self._eager[shape_key] = f"memory guard: {free >> 20} MiB free, graphs hold {held >> 20} MiB"
            return None
        while len(self._entries) >= self.capacity:
            self._entries.popitem(last=False)
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                self.fn(*static)  # warm-up outside capture (lazy library init, workspaces)
            torch.cuda.current_stream().wait_stream(stream)
            reserved_before = torch.cuda.memory_reserved()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                output = self.fn(*static)
            pool_bytes = max(torch.cuda.memory_reserved() - reserved_before, 0)
        except Exception as error:  # noqa: BLE001 - any capture failure falls back to eager replay-free runs
            self._eager[shape_key] = f"capture failed: {type(error).__name__}: {error}"
            warnings.warn(f"CUDA graph capture failed, running eagerly: {error}", RuntimeWarning, stacklevel=3)
            torch.cuda.synchronize()
            return None
        addresses = self.in_place_addresses(inputs, read_keys)
        entry = _Entry(graph, static, read_keys, addresses, output, static_bytes + pool_bytes)
        self._entries[shape_key] = entry
        self.captures += 1
        return entry
