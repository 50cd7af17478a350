"""Does each Slurm job fit a node of its partition? Checked before anything is submitted.

Slurm accepts a job that asks more CPUs, memory or GPUs per node than any node of its partition
has and leaves it PENDING (reason PartitionConfig) forever, unless the cluster sets
EnforcePartLimits; Snakemake then waits for it. `misfits` compares each job's per-node request
with the largest node of its partition (from `sinfo`) and names what to lower.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

from foldmill.errors import FoldmillError

DEFAULT_PARTITION = ""  # key of the cluster's default partition (sinfo marks it with *)


@dataclass(frozen=True)
class NodeCapacity:
    """The most a single node of a partition offers (each field maximized separately)."""

    cpus: int
    mem_mb: int
    gpus: int


@dataclass(frozen=True)
class JobRequest:
    """What one job asks per node; `knobs` names the settings behind each number, for the message."""

    name: str  # the rule
    partition: str  # DEFAULT_PARTITION = the cluster's default
    cpus: int
    mem_mb: int
    gpus: int
    knobs: str = ""


def count_gpus(gres: str) -> int:
    """GPUs in a GRES string as sinfo prints it: `gpu:2`, `gpu:h100:4(S:0-1)`, `gpu:a100:2,shard:8`, `(null)`."""
    total = 0
    for item in gres.split(","):
        fields = re.sub(r"\(.*?\)", "", item).split(":")
        if fields[0] == "gpu":
            total += int(fields[-1]) if len(fields) > 1 and fields[-1].isdigit() else 1
    return total


def parse_sinfo(output: str) -> dict[str, NodeCapacity]:
    """Largest node per partition from `sinfo -h -N -o '%P|%c|%m|%G'`; the default partition
    is also listed under DEFAULT_PARTITION."""
    largest: dict[str, NodeCapacity] = {}
    for line in output.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 4:
            continue
        name, cpus, mem, gres = fields
        node = NodeCapacity(int(cpus.rstrip("+")), int(re.sub(r"\D", "", mem) or 0), count_gpus(gres))
        names = [name.rstrip("*")] + ([DEFAULT_PARTITION] if name.endswith("*") else [])
        for partition in names:
            seen = largest.get(partition, NodeCapacity(0, 0, 0))
            largest[partition] = NodeCapacity(
                max(seen.cpus, node.cpus), max(seen.mem_mb, node.mem_mb), max(seen.gpus, node.gpus)
            )
    return largest


def query_partitions() -> dict[str, NodeCapacity]:
    """Largest node per partition of the cluster this machine submits to."""
    if shutil.which("sinfo") is None:
        raise FoldmillError("sinfo not found: the Slurm profile needs Slurm's client commands on this machine")
    done = subprocess.run(
        ["sinfo", "--noheader", "--Node", "--format=%P|%c|%m|%G"], capture_output=True, text=True, timeout=60
    )
    if done.returncode != 0:
        raise FoldmillError(f"sinfo failed: {done.stderr.strip()}")
    return parse_sinfo(done.stdout)


def misfit(request: JobRequest, partitions: dict[str, NodeCapacity]) -> str | None:
    """One line saying why `request` can never start, or None when a node of its partition can run it."""
    label = f"partition '{request.partition}'" if request.partition else "the default partition"
    node = partitions.get(request.partition)
    if node is None:
        known = ", ".join(sorted(name for name in partitions if name)) or "none"
        return f"{request.name}: Slurm has no {label} (partitions: {known})"
    short = [
        f"{asked} {what} per node (largest node: {has})"
        for what, asked, has in (("CPUs", request.cpus, node.cpus), ("MB", request.mem_mb, node.mem_mb),
                                 ("GPUs", request.gpus, node.gpus))
        if asked > has
    ]  # fmt: skip
    if not short:
        return None
    hint = f"; lower {request.knobs} or pick another partition" if request.knobs else ""
    return f"{request.name}: asks {', '.join(short)} in {label}: it would stay PENDING forever{hint}"


def check_requests(requests: list[JobRequest], partitions: dict[str, NodeCapacity] | None = None) -> None:
    """Raise one FoldmillError naming every job that no node of its partition can run."""
    partitions = query_partitions() if partitions is None else partitions
    problems = list(dict.fromkeys(line for request in requests if (line := misfit(request, partitions))))
    if problems:
        raise FoldmillError("; ".join(problems))
