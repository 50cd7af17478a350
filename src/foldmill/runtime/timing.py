"""GPU timing for benchmarks: CUDA events around each call, median over repeats."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch


def cuda_median_ms(fn: Callable[[], object], repeats: int, warmup: int = 3) -> float:
    """Median milliseconds of fn() over `repeats` runs after `warmup` untimed runs."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)
