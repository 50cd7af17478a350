"""A model replica killed for memory says so: a real local Ray instance whose memory monitor kills a worker
past a limit this module sets, and a replica stage that allocates past it on one target."""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import pytest
from ray import cloudpickle

from foldmill.bench.throughput import PassThrough
from foldmill.executor.cluster import ray_session
from foldmill.executor.plan import WorkItem
from test_executor_ray import CI_EXECUTOR, run_scheduler

# Ray kills past what is in use when the instance starts plus HEADROOM: room for the actors' own start
# (each imports torch) and for other processes on the machine. On the big target the replica takes
# memory a chunk at a time, up to HOG_BYTES, so it passes the limit wherever the others' use went.
HEADROOM = 3 << 30
HOG_BYTES = 7 << 30
CHUNK_BYTES = 256 << 20

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the memory-eating stage below


def memory_in_use() -> tuple[int, int]:
    """(bytes in use, total bytes) of this machine, as /proc/meminfo says."""
    with open("/proc/meminfo", encoding="ascii") as handle:
        info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in handle}
    return info["MemTotal"] - info["MemAvailable"], info["MemTotal"]


@pytest.fixture(scope="module")
def ray_with_a_memory_limit():
    """A local Ray instance whose memory monitor (checking every 100 ms) kills a worker once the machine's
    memory in use passes what it is now plus HEADROOM (RAY_memory_usage_threshold, read when Ray starts)."""
    used, total = memory_in_use()
    if total - used < HOG_BYTES + HEADROOM:
        pytest.skip("not enough free memory to go past the limit safely")
    limits = {"RAY_memory_usage_threshold": f"{(used + HEADROOM) / total:.4f}", "RAY_memory_monitor_refresh_ms": "100"}
    saved = {name: os.environ.get(name) for name in limits}
    os.environ.update(limits)
    try:
        with ray_session(CI_EXECUTOR):
            yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class EatsMemoryOnTheBigTarget(PassThrough):
    """A replica stage that takes up to HOG_BYTES (touched, a chunk at a time) on the target called 'big'."""

    def __call__(self, payload: object) -> object:
        if getattr(payload, "target_id", "") == "big":
            held = []
            while len(held) * CHUNK_BYTES < HOG_BYTES:
                held.append(np.ones(CHUNK_BYTES // 8))
                time.sleep(0.05)  # the monitor looks every 100 ms
            time.sleep(5)
        return payload


def test_a_replica_killed_for_memory_says_out_of_memory_with_the_tokens(ray_with_a_memory_limit) -> None:
    items = [WorkItem("big", 1500, "h", "{}")] + [WorkItem(f"t{i}", 10, "h", "{}") for i in range(3)]
    # Two attempts: Ray's monitor may kill an idle worker beside the replica, whose target then goes again.
    records, _ = run_scheduler(EatsMemoryOnTheBigTarget, items, replicas=1, max_attempts=2)
    status = {record.target_id: record for record in records}
    assert len(records) == len(items)
    big = status["big"]
    assert big.status == "failed", big
    killed = "fold: out of memory (1500 tokens; the worker was killed by Ray's memory monitor, memory "
    assert big.reason.startswith(killed), big.reason
    assert " used / " in big.reason and "limit" in big.reason and "(2 times with this target)" in big.reason
    assert all(status[f"t{i}"].status == "ok" for i in range(3))
