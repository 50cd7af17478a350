"""Gradient reduction and clipping when experts are sharded (without: nothing to reduce, torch's clipping).

DDP / FSDP2 average dense gradients over the world: grad = (1/W) sum_r dL_r/dtheta, with L_r the
loss of rank r's batch. After backward an expert's owner holds sum_{r in its ep group} dL_r/dw
(the all-to-all's backward brought every group member's share home), so summing over the dp
replicas and dividing by W gives the same average. Clipping then needs the norm over all
gradients: dense ones replicated (DDP) or sharded (FSDP2 DTensors), expert ones sharded over ep.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed.tensor import DTensor

from foldmill.moe.kernels import use_triton
from foldmill.moe.parallel.expert_parallel import local_part
from foldmill.moe.parallel.sharding import sharded_expert_parameters


def reduce_expert_gradients(model: nn.Module) -> None:
    """Average the sharded experts' gradients as DDP averages the dense ones (one all-reduce over dp)."""
    experts = list(sharded_expert_parameters(model).values())
    grads = [local_part(parameter.grad) for parameter, _ in experts if parameter.grad is not None]
    if not grads:
        return
    shard = experts[0][1]
    world_size = dist.get_world_size()
    if shard.replicas == 1:
        torch._foreach_div_(grads, world_size)
        return
    flat = _flatten_dense_tensors(grads).div_(world_size)
    dist.all_reduce(flat, group=shard.replica_group)
    for grad, reduced in zip(grads, _unflatten_dense_tensors(flat, grads)):
        grad.copy_(reduced)


def _sum_of_squares(grads: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """float32 sum of the squares of every gradient element: one Triton launch per dtype on CUDA."""
    if grads and use_triton(grads[0]) and all(grad.is_contiguous() and grad.data_ptr() % 16 == 0 for grad in grads):
        from foldmill.moe.kernels.grad_norm import sum_of_squares_triton

        return sum_of_squares_triton(grads)
    total = torch.zeros((), dtype=torch.float32, device=device)
    for grad in grads:
        total += grad.float().pow(2).sum()
    return total


def clip_factor(model: nn.Module, max_norm: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(global L2 norm of all gradients, min(1, max_norm / (norm + 1e-6))); the gradients are untouched.

    Scaling every gradient by the factor is clipping; foldmill's AdamW applies it inside its update
    (`step(grad_scale=factor)`). Without sharded experts the norm is torch's (clip_grad_norm_'s) on
    the CPU, over float32 values; on CUDA it is summed in float32 by one kernel. Either way a bf16
    gradient counts as its float32 value (torch would round each bf16 gradient's norm to bf16), so
    the norm does not depend on the dtype a gradient is stored in.
    """
    experts = sharded_expert_parameters(model)
    if not experts:
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        if grads and use_triton(grads[0]):
            total_norm = _sum_of_squares(grads, grads[0].device).sqrt()
        else:
            total_norm = torch.nn.utils.get_total_norm([grad.float() for grad in grads])
        return total_norm, (max_norm / (total_norm + 1e-6)).clamp(max=1.0)
    shard = next(iter(experts.values()))[1]
    expert_ids = {id(parameter) for parameter, _ in experts.values()}
    parameters = [p for p in model.parameters() if p.grad is not None]
    replicated, world_sharded, expert_sharded = [], [], []
    for parameter in parameters:
        grad = local_part(parameter.grad)
        if id(parameter) in expert_ids:
            expert_sharded.append(grad)
        elif isinstance(parameter.grad, DTensor):  # FSDP2: sharded over the world
            world_sharded.append(grad)
        else:  # DDP: the same on every rank
            replicated.append(grad)
    device = local_part(parameters[0].grad).device
    # One all-reduce over the world: each expert shard is present on `replicas` ranks.
    sharded = _sum_of_squares(world_sharded, device) + _sum_of_squares(expert_sharded, device) / shard.replicas
    dist.all_reduce(sharded)
    total_norm = (_sum_of_squares(replicated, device) + sharded).sqrt()
    return total_norm, (max_norm / (total_norm + 1e-6)).clamp(max=1.0)


def clip_grad_norm(model: nn.Module, max_norm: float) -> torch.Tensor:
    """Scale all gradients so that their global L2 norm is at most max_norm; returns the norm before.

    Without sharded experts this is torch.nn.utils.clip_grad_norm_.
    """
    if not sharded_expert_parameters(model):
        return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    total_norm, factor = clip_factor(model, max_norm)
    for parameter in model.parameters():
        if parameter.grad is not None:
            grad = local_part(parameter.grad)
            grad.mul_(factor.to(grad.dtype))
    return total_norm
