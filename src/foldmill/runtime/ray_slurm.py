"""Ray on Slurm: a fold job's Ray cluster spanning every node of its Slurm allocation.

The usual Ray-on-Slurm pattern, from inside the job: the Ray head starts on the node this process
runs on (the first node of the allocation, where Slurm runs the batch script and Snakemake's job
step), one Ray worker per other node starts through `srun` inside the same allocation, and all
of it is stopped when the fold is done, failed or interrupted. A standing Ray cluster given in
the config (executor.address or RAY_ADDRESS) is joined instead and left running; a one-node job
needs no cluster at all (the executor starts a private local instance).

    with ray_for_job(settings.ray_address(), start_timeout_s) as address:
        ...  # ray.init(address=address) when address is not None
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from foldmill.errors import FoldmillError

log = logging.getLogger(__name__)

# Slurm variables a nested srun may inherit: the job's identity only. Step-level ones (tasks,
# CPUs and GPUs of the step Snakemake started) would silently shape the worker step.
KEEP_SLURM_VARIABLES = {"SLURM_JOB_ID", "SLURM_JOBID", "SLURM_CONF"}
STOP_GRACE_SECONDS = 15.0
AUTH_MODE_VARIABLE, AUTH_TOKEN_VARIABLE = "RAY_AUTH_MODE", "RAY_AUTH_TOKEN"


@dataclass(frozen=True)
class Allocation:
    """The Slurm allocation this process runs in."""

    job_id: str
    nodes: tuple[str, ...]  # every node of the job, in Slurm's order
    this_node: str
    cpus_per_node: int
    gpus_per_node: int

    @property
    def other_nodes(self) -> tuple[str, ...]:
        return tuple(node for node in self.nodes if node != self.this_node)


def expand_nodelist(nodelist: str) -> tuple[str, ...]:
    """Slurm's compressed node list (e.g. `gpu[01-03],big7`) as node names, via scontrol."""
    result = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise FoldmillError(f"scontrol show hostnames {nodelist}: {result.stderr.strip()}")
    return tuple(result.stdout.split())


def _count_gpus(environ: dict[str, str]) -> int:
    if environ.get("SLURM_GPUS_ON_NODE", "").isdigit():
        return int(environ["SLURM_GPUS_ON_NODE"])
    visible = environ.get("CUDA_VISIBLE_DEVICES", "")
    return len([device for device in visible.split(",") if device.strip()])


def current_allocation(environ: dict[str, str] | None = None) -> Allocation | None:
    """The allocation from Slurm's environment, or None outside a Slurm job."""
    environ = dict(os.environ if environ is None else environ)
    job_id, nodelist = environ.get("SLURM_JOB_ID"), environ.get("SLURM_JOB_NODELIST")
    if not job_id or not nodelist:
        return None
    nodes = expand_nodelist(nodelist)
    this_node = environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    cpus = environ.get("SLURM_CPUS_ON_NODE", "")
    return Allocation(
        job_id=job_id,
        nodes=nodes,
        this_node=this_node,
        cpus_per_node=int(cpus) if cpus.isdigit() else len(os.sched_getaffinity(0)),
        gpus_per_node=_count_gpus(environ),
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def _ray_executable() -> str:
    beside_python = Path(sys.executable).with_name("ray")
    return str(beside_python) if beside_python.exists() else (shutil.which("ray") or "ray")


def _node_options(cpus: int, gpus: int, temp_dir: str) -> list[str]:
    # Raylets of several jobs may share a host. A temp dir of the job's own keeps `ray start`
    # from recording this cluster in /tmp/ray/ray_current_cluster, where any plain ray.init()
    # on the node (another job's local instance) would find and join it; the agent port Ray
    # would fix at 52365 is picked free on the node itself.
    return [
        f"--num-cpus={cpus}",
        f"--num-gpus={gpus}",
        f"--temp-dir={temp_dir}",
        f"--dashboard-agent-listen-port={_free_port()}",
        "--disable-usage-stats",
        "--block",
    ]


def head_command(allocation: Allocation, ip: str, port: int, temp_dir: str) -> list[str]:
    return [
        _ray_executable(),
        "start",
        "--head",
        f"--node-ip-address={ip}",
        f"--port={port}",
        f"--ray-client-server-port={_free_port()}",
        "--include-dashboard=false",
        *_node_options(allocation.cpus_per_node, allocation.gpus_per_node, temp_dir),
    ]


def worker_command(allocation: Allocation, head_address: str, temp_dir: str) -> list[str]:
    """srun starting one Ray worker on every other node of the allocation (see `_worker_main`)."""
    others = allocation.other_nodes
    srun = [
        "srun",
        f"--jobid={allocation.job_id}",
        "--overlap",  # Snakemake's job step already holds part of the allocation
        f"--nodes={len(others)}",
        f"--ntasks={len(others)}",
        "--ntasks-per-node=1",
        f"--nodelist={','.join(others)}",
        f"--cpus-per-task={allocation.cpus_per_node}",
        "--kill-on-bad-exit=1",
    ]
    if allocation.gpus_per_node:
        srun.append(f"--gres=gpu:{allocation.gpus_per_node}")
    worker = [sys.executable, "-m", __name__, head_address, str(allocation.cpus_per_node), str(allocation.gpus_per_node), temp_dir]
    return [*srun, *worker]


def _worker_main(argv: list[str]) -> None:
    """On a worker node (run by srun): become `ray start` joining the head, with ports free on this node."""
    head_address, cpus, gpus, temp_dir = argv
    command = [_ray_executable(), "start", f"--address={head_address}", *_node_options(int(cpus), int(gpus), temp_dir)]
    os.execv(command[0], command)


def step_environment() -> dict[str, str]:
    """This process's environment without the step-level Slurm variables (see KEEP_SLURM_VARIABLES)."""
    environ = dict(os.environ)
    for name in list(environ):
        if (name.startswith("SLURM_") and name not in KEEP_SLURM_VARIABLES) or name.startswith(("SRUN_", "SBATCH_")):
            del environ[name]
    environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Ray is stopped only once the fold is over: nothing is left to drain (Ray would wait 30 s).
    environ.setdefault("RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "0")
    return environ


def _stop(process: subprocess.Popen, what: str) -> None:
    """SIGTERM the process group (ray start and the daemons it spawned), SIGKILL after a grace period."""
    if process.poll() is None:
        for sig, wait in ((signal.SIGTERM, STOP_GRACE_SECONDS), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                break
            try:
                process.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
    log.info("stopped %s", what)


def _launch(command: list[str], what: str, stack: ExitStack) -> subprocess.Popen:
    log.info("starting %s: %s", what, " ".join(command))
    # A session of its own: stopping it reaches every process it started, and nothing else.
    process = subprocess.Popen(command, env=step_environment(), start_new_session=True)
    stack.callback(_stop, process, what)
    return process


def wait_for_nodes(address: str, expected: int, timeout_s: float, launched: dict[str, subprocess.Popen]) -> None:
    """Block until `expected` Ray nodes are alive at `address`; fail early if a launcher died."""
    import ray

    deadline = time.monotonic() + timeout_s
    alive = 0
    while time.monotonic() < deadline:
        for what, process in launched.items():
            if process.poll() is not None:
                raise FoldmillError(f"Ray on Slurm: the {what} exited with status {process.returncode} (see the job's log)")
        try:
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
            try:
                alive = sum(1 for node in ray.nodes() if node["Alive"])
            finally:
                ray.shutdown()
        except ConnectionError:
            alive = 0
        if alive >= expected:
            return
        time.sleep(1.0)
    raise FoldmillError(
        f"Ray on Slurm: {alive} of {expected} nodes joined {address} within {timeout_s:.0f} s (slurm.ray_start_timeout_s)"
    )


@contextmanager
def _job_token() -> Iterator[None]:
    """A fresh Ray authentication token for this job's cluster, in the environment while it runs.

    Ray enables token authentication for clusters started with `ray start`; a token per job
    (rather than ~/.ray/auth_token) keeps the cluster private to the job. srun passes the
    environment on to the workers; the driver in this process reads it in ray.init().
    """
    saved = {name: os.environ.get(name) for name in (AUTH_MODE_VARIABLE, AUTH_TOKEN_VARIABLE)}
    os.environ[AUTH_MODE_VARIABLE] = "token"
    os.environ[AUTH_TOKEN_VARIABLE] = secrets.token_hex(32)
    _reload_ray_auth_settings()
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        _reload_ray_auth_settings()


def _reload_ray_auth_settings() -> None:
    """Make this process's Ray see the current RAY_AUTH_* variables.

    Ray reads them once, when it is imported; Ray itself re-initializes its config this way
    when it turns token authentication on. Rays without token authentication have nothing to reload.
    """
    import ray._raylet as raylet

    if hasattr(raylet, "AuthenticationTokenLoader"):
        raylet.Config.initialize("")
        raylet.AuthenticationTokenLoader.instance().reset_cache()


@contextmanager
def ray_cluster_on_allocation(allocation: Allocation, start_timeout_s: float) -> Iterator[str]:
    """Start a Ray head here and a worker on each other node of `allocation`; yield the head's address."""
    from ray.util import get_node_ip_address

    ip, port = get_node_ip_address(), _free_port()
    address = f"{ip}:{port}"
    temp_dir = os.path.join(tempfile.gettempdir(), f"ray-{allocation.job_id}-{port}")
    with _job_token(), ExitStack() as stack:
        stack.callback(shutil.rmtree, temp_dir, ignore_errors=True)  # this node's; Slurm cleans the others' /tmp
        launched = {"Ray head": _launch(head_command(allocation, ip, port, temp_dir), "Ray head", stack)}
        wait_for_nodes(address, 1, start_timeout_s, launched)
        if allocation.other_nodes:
            workers = worker_command(allocation, address, temp_dir)
            launched["Ray workers (srun)"] = _launch(workers, "Ray workers (srun)", stack)
        wait_for_nodes(address, len(allocation.nodes), start_timeout_s, launched)
        log.info("Ray cluster at %s: %d nodes (%s)", address, len(allocation.nodes), ", ".join(allocation.nodes))
        yield address


@contextmanager
def ray_for_job(address: str | None, start_timeout_s: float = 300.0) -> Iterator[str | None]:
    """The Ray address a fold job should use (None = start a local instance), alive for the block.

    `address` (a standing cluster) is passed through untouched. Inside a Slurm allocation of
    several nodes a cluster is started across them and stopped afterwards. Otherwise: None.
    """
    if address:
        yield address
        return
    allocation = current_allocation()
    if allocation is None or len(allocation.nodes) < 2:
        yield None
        return
    with ray_cluster_on_allocation(allocation, start_timeout_s) as started:
        yield started


if __name__ == "__main__":
    _worker_main(sys.argv[1:])
