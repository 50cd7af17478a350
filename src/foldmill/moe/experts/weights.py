"""Quantized copies of expert weights, made once per optimizer step instead of once per GEMM call.

A copy is keyed by the weight tensor itself, its version counter and the number of optimizer steps
taken in this process. In-place updates bump the version (`copy_` under no_grad, loading a
checkpoint, foreach optimizers) but PyTorch's fused optimizers do not, so every torch.optim step
also counts, through a global post-step hook. A weight that is a fresh tensor on every forward pass
(the bf16 cast of fp32 master weights under the bf16-mixed recipe) is quantized once per pass: its
forward and backward GEMMs share the copies. Entries hold their weight weakly: once the caller has
dropped the weight (a cast, after its backward pass), the next lookup drops its copies, which would
otherwise stay allocated, and keep the cast's autograd graph alive, into the next step.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

_optimizer_steps = 0


def _count_optimizer_step(optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
    global _optimizer_steps
    _optimizer_steps += 1


register_optimizer_step_post_hook(_count_optimizer_step)


def invalidate_weight_copies() -> None:
    """Make every cached copy stale, as an optimizer step does (weights changed outside torch.optim,
    e.g. by a replayed CUDA graph, or a graph about to be captured must record the copies)."""
    global _optimizer_steps
    _optimizer_steps += 1


class WeightCache:
    def __init__(self, capacity: int = 4) -> None:
        # One expert MLP has two weights, each needed in two layouts (forward and dgrad).
        self.capacity = capacity
        self._entries: OrderedDict[tuple[str, int], tuple[weakref.ref, tuple[int, int], object]] = OrderedDict()

    def get(self, tag: str, weight: torch.Tensor, make: Callable[[torch.Tensor], object]) -> object:
        """make(weight), reused while `weight` is the same tensor, unchanged."""
        self._drop_dead()
        key = (tag, id(weight))
        state = (weight._version, _optimizer_steps)
        entry = self._entries.get(key)
        if entry is not None and entry[0]() is weight and entry[1] == state:
            self._entries.move_to_end(key)
            return entry[2]
        value = make(weight)
        self._entries[key] = (weakref.ref(weight), state, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
        return value

    def _drop_dead(self) -> None:
        for key in [key for key, (ref, _, _) in self._entries.items() if ref() is None]:
            del self._entries[key]

    def __len__(self) -> int:
        self._drop_dead()
        return len(self._entries)
