"""The (data-parallel x expert-parallel) device mesh of MoE pretraining.

world = dp x ep processes. Rank r sits at (dp = r // ep, ep = r % ep): the ranks of one
expert-parallel group are consecutive, so with ep <= GPUs per node the token all-to-all stays
inside a node (NVLink). Each group splits the experts among its ep ranks; the dp groups hold
replicas. Dense layers are data-parallel over the whole world (DDP or FSDP2).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from foldmill.errors import FoldmillError


def data_parallel_size(world_size: int, expert_parallel: int, num_experts: int) -> int:
    """dp of the layout, or FoldmillError when ep divides neither the processes nor the experts."""
    if world_size % expert_parallel or num_experts % expert_parallel:
        raise FoldmillError(
            f"expert_parallel {expert_parallel} must divide the number of processes ({world_size}) "
            f"and of experts ({num_experts})"
        )
    return world_size // expert_parallel


def build_mesh(world_size: int, expert_parallel: int, num_experts: int, device: torch.device) -> DeviceMesh:
    """The ("dp", "ep") mesh over every process (the default process group must be initialized)."""
    dp = data_parallel_size(world_size, expert_parallel, num_experts)
    return init_device_mesh(device.type, (dp, expert_parallel), mesh_dim_names=("dp", "ep"))


@dataclass(frozen=True)
class ExpertShard:
    """This rank's place in the mesh: which experts it holds and whom it exchanges tokens with."""

    mesh: DeviceMesh  # ("dp", "ep")
    size: int  # ranks sharing out the experts (ep)
    rank: int  # position in the expert-parallel group: holds experts [rank * E / ep, (rank + 1) * E / ep)
    replicas: int  # ranks holding the same experts (dp)
    group: dist.ProcessGroup  # the expert-parallel group: the all-to-alls run in it
    replica_group: dist.ProcessGroup  # the ranks holding the same experts: expert gradients are summed over it

    @classmethod
    def of(cls, mesh: DeviceMesh) -> ExpertShard:
        return cls(mesh, mesh["ep"].size(), mesh.get_local_rank("ep"), mesh["dp"].size(), mesh.get_group("ep"),
                   mesh.get_group("dp"))
