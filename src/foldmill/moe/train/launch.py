"""Start pretraining in this process, under torchrun with one process per GPU, or across the nodes of
a Slurm allocation (srun starts one torchrun per node; torchrun's c10d rendezvous joins them)."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from foldmill.errors import FoldmillError
from foldmill.moe.config import TrainConfig
from foldmill.moe.train.distributed import NVLINK_MULTICAST_OFF, torchrun_world_size
from foldmill.moe.train.run_lock import refuse_if_training


def train_arguments(corpus_dir: str | Path, run_dir: str | Path, config: TrainConfig) -> list[str]:
    """`foldmill pretrain train` arguments reproducing `config`."""
    arguments = ["pretrain", "train", "--corpus", str(corpus_dir), "--run-dir", str(run_dir)]
    for field in dataclasses.fields(config):
        arguments += [f"--{field.name.replace('_', '-')}", str(getattr(config, field.name))]
    return arguments


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def torchrun_command(
    train: list[str], processes: int, nodes: int = 1, rendezvous: str = "", job_id: str = ""
) -> list[str]:
    """torchrun running `foldmill <train...>` with `processes` per node; several nodes meet at `rendezvous`."""
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={processes}"]
    if nodes == 1:
        command.append("--standalone")
    else:
        command += [f"--nnodes={nodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rendezvous}", f"--rdzv-id={job_id}"]
    return [*command, "-m", "foldmill", *train]


def srun_command(
    torchrun: list[str], job_id: str, nodes: list[str], cpus_per_node: int, gpus_per_node: int
) -> list[str]:
    """srun starting `torchrun` once on each of `nodes`, inside the job's allocation."""
    command = ["srun", f"--jobid={job_id}", "--overlap", f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}",
               "--ntasks-per-node=1", f"--nodelist={','.join(nodes)}", f"--cpus-per-task={cpus_per_node}",
               "--kill-on-bad-exit=1"]
    if gpus_per_node:
        command.append(f"--gres=gpu:{gpus_per_node}")
    return [*command, *torchrun]


def launch_command(train: list[str], processes: int, nodes: int = 1) -> tuple[list[str], dict[str, str]]:
    """(command, environment) running `foldmill <train...>` with `processes` per node on `nodes` nodes:
    torchrun here, or with several nodes srun + torchrun across the Slurm job this process runs in."""
    if nodes == 1:
        return torchrun_command(train, processes), {**os.environ, **NVLINK_MULTICAST_OFF}
    from foldmill.runtime.ray_slurm import current_allocation, step_environment

    allocation = current_allocation()
    if allocation is None or len(allocation.nodes) < nodes:
        found = "no Slurm allocation" if allocation is None else f"an allocation of {len(allocation.nodes)} node(s)"
        raise FoldmillError(f"pretraining on {nodes} nodes needs a Slurm job of {nodes} nodes; found {found}")
    from ray.util import get_node_ip_address

    # This process runs on the allocation's first node: it hosts the rendezvous, at the address
    # other nodes reach it by (Slurm node names need not resolve).
    rendezvous = f"{get_node_ip_address()}:{_free_port()}"
    torchrun = torchrun_command(train, processes, nodes, rendezvous, allocation.job_id)
    command = srun_command(torchrun, allocation.job_id, list(allocation.nodes[:nodes]), allocation.cpus_per_node,
                           allocation.gpus_per_node)
    return command, {**step_environment(), **NVLINK_MULTICAST_OFF}


def launch_pretrain(
    corpus_dir: str | Path, run_dir: str | Path, config: TrainConfig, processes: int, nodes: int = 1
) -> dict:
    """Train with `processes` workers per node (torchrun, one per GPU) on `nodes` nodes (srun in a
    Slurm job), or in this process when both are 1."""
    if torchrun_world_size() == 1:  # a torchrun worker's launcher checked; its rank 0 locks
        refuse_if_training(run_dir)
    if processes <= 1 and nodes <= 1:
        from foldmill.moe.train.trainer import pretrain

        return pretrain(corpus_dir, run_dir, config)
    command, environment = launch_command(train_arguments(corpus_dir, run_dir, config), max(processes, 1), nodes)
    completed = subprocess.run(command, env=environment, check=False)
    if completed.returncode:
        raise FoldmillError(f"pretraining with {nodes} x {processes} processes failed (exit {completed.returncode})")
    return json.loads((Path(run_dir) / "summary.json").read_text(encoding="utf-8"))
