"""Start or join Ray and create the actor pools: featurizers, model replicas (one per GPU), writers.

Without an address (executor.address or RAY_ADDRESS) foldmill starts a lean local instance bound
to 127.0.0.1: no dashboard, no usage stats, no metrics, the CPUs and GPUs this process may use, its
session (logs, sockets, spilled objects) under the run's own temp dir (ray_temp_dir), not /tmp/ray.
With one, it joins that cluster (multi-node included) and uses every GPU the cluster offers.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayError

from foldmill.errors import FoldmillError
from foldmill.executor.scheduler import Pools, Slot
from foldmill.executor.settings import ExecutorSettings
from foldmill.executor.worker import StageWorker

log = logging.getLogger(__name__)

RESTARTS = 4  # times Ray restarts a crashed actor before the scheduler retires it
NAMESPACE = "foldmill"
RAY_DIRNAME = ".ray"  # OUTDIR/.ray: the sessions of the run's local Ray instances
UNIX_SOCKET_PATH_MAX = 107  # bytes of an AF_UNIX socket path (Linux), which Ray checks at start
# What Ray appends to its temp dir for its longest socket path (7-digit pid, a numbered socket).
RAY_SOCKET_SUFFIX = "/session_2026-01-01_00-00-00_000000_4194304/sockets/plasma_store.99"


def available_cpus() -> int:
    """CPUs this process may use (Slurm and cgroup affinity included)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def ray_temp_dir(settings: ExecutorSettings, outdir: Path, run_id: str) -> tuple[Path, bool]:
    """Where a local Ray instance keeps its session: executor.scratch_dir, else OUTDIR/.ray. A path too long
    for Ray's socket paths falls back to a directory of this run under the system's temp dir, said once.
    Returns (directory, whether it is the run's own, to be removed after the run)."""
    base = Path(settings.scratch_dir or Path(outdir) / RAY_DIRNAME).absolute()
    if len(os.fsencode(base)) + len(RAY_SOCKET_SUFFIX) <= UNIX_SOCKET_PATH_MAX:
        return base, False
    short = Path(tempfile.gettempdir()) / f"foldmill-ray-{run_id}"
    limit = UNIX_SOCKET_PATH_MAX - len(RAY_SOCKET_SUFFIX)
    log.warning("%s is too long for Ray's socket paths (%d bytes at most): Ray's temp dir is %s", base, limit, short)
    return short, True


@contextmanager
def ray_session(settings: ExecutorSettings, temp_dir: Path | None = None, own_temp_dir: bool = False) -> Iterator[None]:
    """Connected to Ray for the duration of the block; a local instance is shut down afterwards.
    `temp_dir`: the local instance's (None: Ray's default, /tmp/ray); `own_temp_dir`: remove it afterwards."""
    if ray.is_initialized():  # an embedding program (a test, the benchmark) already connected
        yield
        return
    address = settings.ray_address()
    common: dict[str, Any] = {"namespace": NAMESPACE, "log_to_driver": False, "logging_level": logging.WARNING}
    if address:
        log.info("joining the Ray cluster at %s", address)
        ray.init(address=address, **common)
    else:
        for name, value in (("RAY_USAGE_STATS_ENABLED", "0"), ("RAY_enable_metrics_collection", "0")):
            os.environ.setdefault(name, value)
        cpus = settings.cpus or available_cpus()
        object_store = settings.object_store_mb * 1024 * 1024 or None
        log.info("starting a local Ray instance with %d CPUs", cpus)
        clock = time.perf_counter()
        if temp_dir is not None:
            temp_dir.mkdir(parents=True, exist_ok=True)
        ray.init(
            address="local",  # a new instance, never some other Ray already running on this machine
            _temp_dir=str(temp_dir) if temp_dir is not None else None,
            num_cpus=cpus,
            num_gpus=settings.gpus or None,
            include_dashboard=False,
            object_store_memory=object_store,
            _node_ip_address="127.0.0.1",
            **common,
        )
        log.info("Ray is up (%.1f s)", time.perf_counter() - clock)
    try:
        yield
    finally:
        ray.shutdown()
        if own_temp_dir and temp_dir is not None and not address:
            shutil.rmtree(temp_dir, ignore_errors=True)


def replica_count(settings: ExecutorSettings, device: str) -> int:
    if device == "cpu":
        return max(1, settings.cpu_replicas)
    gpus = int(ray.cluster_resources().get("GPU", 0))
    if gpus < 1:
        raise FoldmillError("model.device is cuda but Ray sees no GPU (set model.device: cpu to fold on CPUs)")
    return gpus


def start_pools(
    settings: ExecutorSettings,
    device: str,
    build_featurizer: Callable[[], Any],
    build_replica: Callable[[], Any],
    build_writer: Callable[[], Any],
    run_id: str,
) -> Pools:
    """Create every actor; return once the featurizers and writers have built their stages.

    The model replicas load their models meanwhile: each is a slot still starting (its `ready` call
    in flight), which the Scheduler takes into service when it reports. So the first targets are
    featurized while the models load, instead of the GPUs waiting for them afterwards. Actors are
    named `<role><index>-<run_id>` in the "foldmill" namespace, so `ray list actors` (or a test) can
    find a run's replicas.
    """
    remote = ray.remote(StageWorker)
    replicas = replica_count(settings, device)
    if device == "cuda":
        # The GPU is the reservation: a job with few CPUs still gets a replica on every GPU.
        replica_options: dict[str, Any] = {"num_gpus": 1, "num_cpus": 0}
        replica_threads = 2
        names = ["gpu"] * replicas
    else:
        # CPU replicas share the cores; featurize and write actors take no CPU reservation so
        # they fit beside them on a small machine (they are light next to the model).
        node_cpus = max(int(node["Resources"].get("CPU", 1)) for node in ray.nodes() if node["Alive"])
        replica_threads = max(1, min(node_cpus, int(ray.cluster_resources().get("CPU", 1)) // replicas))
        replica_options = {"num_cpus": replica_threads}
        names = [f"cpu{index}" for index in range(replicas)]
    restart = {"max_restarts": RESTARTS, "max_task_retries": 0}

    def create(role: str, prefixes: list[str], build: Callable[[], Any], options: dict[str, Any], threads: int) -> list[Any]:
        return [
            remote.options(name=f"{role}{index}-{run_id}", **options, **restart).remote(prefix, build, threads)
            for index, prefix in enumerate(prefixes)
        ]

    workers = max(1, settings.cpu_workers)
    replica_actors = create("replica", names, build_replica, replica_options, replica_threads)  # the slowest first
    featurize_actors = create("featurize", [f"featurize{i}" for i in range(workers)], build_featurizer, {"num_cpus": 0}, 1)
    write_actors = create("write", [f"write{i}" for i in range(workers)], build_writer, {"num_cpus": 0}, 1)
    starting = [
        Slot(f"replica{index}", handle, RESTARTS, probe=handle.ready.remote())
        for index, handle in enumerate(replica_actors)
    ]
    reports = iter(_ready(featurize_actors + write_actors, also_kill=replica_actors))  # in that order

    def slots(handles: list[Any]) -> list[Slot]:
        return [
            Slot(info["name"], handle, RESTARTS, started=True, pid=info["pid"])
            for handle, info in zip(handles, reports)
        ]

    return Pools(featurizers=slots(featurize_actors), replicas=starting, writers=slots(write_actors))


def stop_pools(pools: Pools) -> None:
    """End a run's actors (they would otherwise live as long as the Ray session)."""
    for slot in pools.featurizers + pools.replicas + pools.writers:
        ray.kill(slot.handle, no_restart=True)


def _ready(handles: list[Any], also_kill: list[Any]) -> list[dict[str, Any]]:
    """What the started actors report; one whose stage could not be built stops the run with its error
    (every actor of the run goes, `also_kill` too)."""
    try:
        reports = ray.get([handle.ready.remote() for handle in handles])
    except RayError as error:  # e.g. killed by Ray's memory monitor while starting
        for handle in handles + also_kill:
            ray.kill(handle, no_restart=True)
        raise FoldmillError(f"the workers could not start: {str(error).strip().splitlines()[0]}") from None
    for report in reports:
        if report["error"]:
            for handle in handles + also_kill:
                ray.kill(handle, no_restart=True)
            raise FoldmillError(f"{report['name']} could not start: {report['error']}")
    return reports
