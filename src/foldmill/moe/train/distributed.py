"""Process group set-up (torchrun environment) and model wrapping: DDP, or FSDP2 per decoder layer."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class Dist:
    rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed() -> Dist:
    """Join the process group torchrun describes (WORLD_SIZE > 1), else run as a single process."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Dist(rank, world_size, device)


def wrap_model(model: nn.Module, parallel: str, env: Dist) -> nn.Module:
    """DDP, or FSDP2 (each decoder layer, then the root) when several processes run."""
    if env.world_size == 1:
        return model
    if parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
        return model
    return nn.parallel.DistributedDataParallel(model, device_ids=[env.device.index] if env.device.type == "cuda" else None)


def unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized():
        dist.all_reduce(values)
    return values


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()
