"""GPU timing for benchmarks: CUDA events around each call, median over repeats; and the host's time
to issue a call."""

from __future__ import annotations

import statistics
import time
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


def cuda_graph_median_ms(fn: Callable[[], object], calls: int = 20, replays: int = 5) -> float:
    """Median milliseconds per fn() call over `replays` replays of one CUDA graph that holds `calls`
    calls: for kernels shorter than their launch from Python, whose eager timing measures the host."""
    fn()  # compile and autotune outside the capture
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return cuda_median_ms(graph.replay, replays, warmup=1) / calls


def host_median_ms(fn: Callable[[], object], repeats: int, warmup: int = 3) -> float:
    """Median milliseconds until fn() returns, each call starting on an idle GPU: the host's time to
    issue its kernels. Beside cuda_median_ms's GPU time it says whether a call is bound by its host."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(times)
