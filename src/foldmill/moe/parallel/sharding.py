"""Experts split across expert-parallel ranks, and their global layout in checkpoints.

`shard_experts` keeps in each Experts module only this rank's E/ep experts (every rank first
builds the whole model from the same seed, so the shards are slices of the single-process
initialization). DDP / FSDP2 must ignore these parameters: moe.parallel.gradients reduces their
gradients. A model's parameters must be all plain tensors or all DTensors (fused and foreach
AdamW refuse a mix), so next to DDP the shards are plain tensors and next to FSDP2 they are
DTensors on the ("dp", "ep") mesh: replicated over dp, Shard(0) over ep.

Checkpoints hold every expert tensor in that global shape (E, ...): before torch.distributed.checkpoint
sees a state dict, plain shards become such DTensors too, so DCP writes each expert once and
reads back whatever slice a rank of another layout (another ep, or one plain process) asks for.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard

from foldmill.moe.model.moe import Experts
from foldmill.moe.parallel.mesh import ExpertShard

EXPERT_WEIGHTS = ("gate_up_proj", "down_proj")


def shard_experts(model: nn.Module, mesh: DeviceMesh, as_dtensors: bool = False) -> None:
    """Keep this rank's experts in every Experts module of `model` (before wrapping and optimizer),
    as plain tensors or, with `as_dtensors`, as global-shape DTensors."""
    shard = ExpertShard.of(mesh)
    for module in model.modules():
        if not isinstance(module, Experts):
            continue
        for name in EXPERT_WEIGHTS:
            full = getattr(module, name)
            local = full.shape[0] // shard.size
            piece = full.detach()[shard.rank * local : (shard.rank + 1) * local].clone()
            piece = _global(piece, shard) if as_dtensors else piece
            setattr(module, name, nn.Parameter(piece, requires_grad=full.requires_grad))
        module.shard = shard


def sharded_expert_parameters(model: nn.Module) -> dict[str, tuple[nn.Parameter, ExpertShard]]:
    """{parameter name: (parameter, shard)} of the sharded experts of an unwrapped model (names as in
    its state dict); empty without expert parallelism."""
    found = {}
    for module_name, module in model.named_modules():
        if isinstance(module, Experts) and module.shard is not None:
            for name in EXPERT_WEIGHTS:
                found[f"{module_name}.{name}"] = (getattr(module, name), module.shard)
    return found


def _global(local: Tensor, shard: ExpertShard) -> DTensor:
    shape = torch.Size((local.shape[0] * shard.size, *local.shape[1:]))
    stride = torch.empty(shape, device="meta").stride()  # contiguous, as the local shards are
    return DTensor.from_local(local.contiguous(), shard.mesh, [Replicate(), Shard(0)], run_check=False,
                              shape=shape, stride=stride)


def _map_expert_tensors(model_state: dict, optim_state: dict | None, experts: dict, convert) -> None:
    """Apply `convert(tensor, shard)` in place to the expert entries of model and optimizer state dicts
    (optimizer state keyed by parameter name, as torch.distributed.checkpoint.state_dict gives it)."""
    for name, (_, shard) in experts.items():
        if name in model_state:
            model_state[name] = convert(model_state[name], shard)
        per_parameter = (optim_state or {}).get("state", {}).get(name, {})
        for key, value in per_parameter.items():
            # Moments have the parameter's shape; AdamW's `step` is a scalar shared by all ranks.
            if isinstance(value, Tensor) and value.dim() > 0:
                per_parameter[key] = convert(value, shard)


def _plain_experts(model: nn.Module) -> dict[str, tuple[nn.Parameter, ExpertShard]]:
    experts = sharded_expert_parameters(model)
    return {name: entry for name, entry in experts.items() if not isinstance(entry[0], DTensor)}


def expert_state_to_global(model_state: dict, optim_state: dict | None, model: nn.Module) -> None:
    """Turn the plain sharded expert tensors of the state dicts into global-shape DTensors, in place."""
    _map_expert_tensors(model_state, optim_state, _plain_experts(model), _global)


def expert_state_to_local(model_state: dict, optim_state: dict | None, model: nn.Module) -> None:
    """Undo `expert_state_to_global` (after DCP filled the DTensors), in place."""
    _map_expert_tensors(model_state, optim_state, _plain_experts(model), lambda value, _: value.to_local())
