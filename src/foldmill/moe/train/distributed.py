"""Process group set-up (torchrun environment) and model wrapping: DDP, or FSDP2 per decoder layer."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from foldmill.moe.parallel.mesh import build_mesh
from foldmill.moe.parallel.sharding import shard_experts, sharded_expert_parameters

# Environment that keeps NCCL, PyTorch symmetric memory and NVSHMEM off NVLink multicast.
NVLINK_MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


@dataclass(frozen=True)
class Dist:
    rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def torchrun_world_size() -> int:
    """How many workers torchrun started this process among; 1 outside torchrun."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def init_distributed() -> Dist:
    """Join the process group torchrun describes (WORLD_SIZE > 1), else run as a single process."""
    world_size = torchrun_world_size()
    rank = int(os.environ.get("RANK", "0"))
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if world_size > 1 and not dist.is_initialized():
        if device.type == "cuda":
            # NVLink multicast (NVLS) can take a shared host's GPUs out of service: keep it off,
            # also when torchrun was started by hand (NCCL reads this when the group is created).
            os.environ.update(NVLINK_MULTICAST_OFF)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Dist(rank, world_size, device)


def wrap_model(model: nn.Module, parallel: str, env: Dist, expert_parallel: int = 1) -> nn.Module:
    """DDP, or FSDP2 (each decoder layer, then the root), over the process group where one was set
    up (init_distributed sets one up when several processes run).

    With expert_parallel > 1 the experts are first split over a (dp x ep) mesh
    (moe.parallel); DDP / FSDP2 then cover only the dense parameters, and the trainer reduces
    the expert gradients itself (moe.parallel.gradients).
    """
    if expert_parallel > 1:
        mesh = build_mesh(env.world_size, expert_parallel, model.config.num_experts, env.device)
        shard_experts(model, mesh, as_dtensors=parallel == "fsdp")
    if not dist.is_initialized():
        return model
    experts = sharded_expert_parameters(model)
    if parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard

        ignored = {parameter for parameter, _ in experts.values()}
        for layer in model.layers:
            fully_shard(layer, ignored_params=ignored)
        fully_shard(model, ignored_params=ignored)
        return model
    if experts:
        nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, list(experts))
    device_ids = [env.device.index] if env.device.type == "cuda" else None
    # The model's only buffers, the RoPE tables, are computed alike by every process: no broadcast
    # before each forward pass.
    return nn.parallel.DistributedDataParallel(model, device_ids=device_ids, broadcast_buffers=False)


def step_can_be_captured(parallel: str, expert_parallel: int) -> bool:
    """Whether the trainer captures the steps of wrap_model's model in a CUDA graph (train/graphs.py):
    without a process group, or under DDP over a group of this process alone. FSDP2 gathers and
    frees weights from Python, and expert parallelism sizes its token exchanges on the host. DDP
    steps of several processes run eagerly: their captured all-reduces have not run on several
    GPUs yet."""
    if not dist.is_initialized():
        return True
    return dist.get_world_size() == 1 and parallel == "ddp" and expert_parallel == 1


def deferred_gradient_sync(model: nn.Module) -> Callable[[], contextlib.AbstractContextManager]:
    """For the micro-batches of an optimizer step before its last: DDP's no_sync, so that the
    gradients are all-reduced once, summed, with the last. FSDP2 reduce-scatters each micro-batch's
    gradients into its shards, which sum them (and keeps no unsharded gradients between them)."""
    if isinstance(model, nn.parallel.DistributedDataParallel):
        return model.no_sync
    return contextlib.nullcontext


@contextlib.contextmanager
def one_process_group(device: torch.device) -> Iterator[None]:
    """Within the block, a NCCL process group of this process alone: wrap_model builds DDP, whose
    hooks and all-reduces then run on one GPU (the bench's DDP rows, the GPU tests)."""
    if dist.is_initialized():
        raise RuntimeError("one_process_group: a process group is set up already")
    os.environ.update(NVLINK_MULTICAST_OFF)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=device)
    try:
        yield
    finally:
        dist.destroy_process_group()


def unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized():
        dist.all_reduce(values)
    return values


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()
