"""AdamW with decoupled weight decay on matrices only, and a warmup + cosine learning-rate schedule."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from foldmill.moe.config import TrainConfig
from foldmill.moe.kernels import use_triton


class AdamW(torch.optim.AdamW):
    """torch's AdamW (same hyperparameters, state and checkpoints) whose step also applies the
    gradient-clipping factor: `step(grad_scale=factor)` updates as if every gradient had been
    multiplied by `factor` (a float32 scalar tensor) first.

    On CUDA with Triton, one kernel per parameter reads the unscaled gradient and applies the
    factor as it goes (kernels/adamw.py), instead of a clipping pass over all gradients and torch's
    fused update; the gradients are left unscaled. Elsewhere the gradients are scaled in place and
    torch's AdamW steps.

    `master_weights` ({bf16 parameter: float32 master}, train/precision.py): those parameters are
    updated in their masters' float32, with float32 states, and receive the result rounded to bf16.
    """

    def __init__(self, params, *args, master_weights: dict[nn.Parameter, torch.Tensor] | None = None,
                 **kwargs) -> None:
        super().__init__(params, *args, **kwargs)
        self.master_weights = dict(master_weights or {})

    @torch.no_grad()
    def step(self, closure=None, grad_scale: torch.Tensor | None = None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        params = [p for group in self.param_groups for p in group["params"] if p.grad is not None]
        if not params:
            return loss
        if grad_scale is not None and all(_triton_steps(p, self.master_weights.get(p)) for p in params):
            self._triton_step(grad_scale)
            return loss
        with self._masters_in_place():
            if grad_scale is not None:
                _scale_gradients([p.grad for p in params], grad_scale)
            super().step()
        return loss

    def load_state_dict(self, state_dict: dict) -> None:
        # torch casts the loaded states to each parameter's dtype: float32 for those with masters.
        with self._masters_in_place():
            super().load_state_dict(state_dict)

    @contextlib.contextmanager
    def _masters_in_place(self) -> Iterator[None]:
        """Inside, each parameter with a master holds the master and a float32 copy of its gradient,
        so that torch's update and state handling work in float32; on leaving, the parameters get
        back their bf16 storage, with the masters' values rounded into it, and their gradients."""
        swapped = []
        for param, master in self.master_weights.items():
            swapped.append((param, param.data, param.grad))
            param.data = master
            param.grad = None if param.grad is None else param.grad.float()
        try:
            yield
        finally:
            for param, storage, grad in swapped:
                param.data = storage
                storage.copy_(self.master_weights[param])
                param.grad = grad

    def _triton_step(self, grad_scale: torch.Tensor) -> None:
        from foldmill.moe.kernels.adamw import adamw_step_triton

        for group in self.param_groups:
            if group["amsgrad"] or group["maximize"]:
                raise ValueError("foldmill's AdamW step does not implement amsgrad or maximize")
            params = [p for p in group["params"] if p.grad is not None]
            for param in params:
                state = self.state[param]
                if not state:
                    values = self.master_weights.get(param, param)
                    state["step"] = torch.zeros((), dtype=torch.float32, device=param.device)
                    state["exp_avg"] = torch.zeros_like(values, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(values, memory_format=torch.preserve_format)
                elif not state["step"].is_cuda:  # torch's unfused step keeps its counter on the host
                    state["step"] = state["step"].to(device=param.device, dtype=torch.float32)
            if not params:
                continue
            torch._foreach_add_([self.state[p]["step"] for p in params], 1.0)
            beta1, beta2 = group["betas"]
            scale = grad_scale.to(device=params[0].device, dtype=torch.float32)
            for param in params:
                state, master = self.state[param], self.master_weights.get(param)
                adamw_step_triton(param if master is None else master, param.grad, state["exp_avg"],
                                  state["exp_avg_sq"], state["step"], scale, float(group["lr"]), float(beta1),
                                  float(beta2), group["eps"], group["weight_decay"],
                                  rounded=None if master is None else param)


def _scale_gradients(grads: list[torch.Tensor], factor: torch.Tensor) -> None:
    """grad *= factor in place; DTensor gradients (FSDP2, sharded experts) on their own shards, since
    they may live on different device meshes."""
    if isinstance(factor, DTensor):
        factor = factor.full_tensor()
    plain = [grad for grad in grads if not isinstance(grad, DTensor)]
    if plain:
        torch._foreach_mul_(plain, factor.to(plain[0].device))
    for grad in grads:
        if isinstance(grad, DTensor):
            shard = grad.to_local()
            shard.mul_(factor.to(shard.device, shard.dtype))


def _triton_steps(param: torch.Tensor, master: torch.Tensor | None) -> bool:
    """Whether the Triton update applies: a plain contiguous CUDA tensor (the parameter, or its
    master) and gradient."""
    values = param if master is None else master
    return (use_triton(values) and type(param.data) is torch.Tensor and values.is_contiguous()
            and param.grad.is_contiguous() and param.grad.dtype == param.dtype)


def build_optimizer(model: nn.Module, config: TrainConfig,
                    master_weights: dict[nn.Parameter, torch.Tensor] | None = None) -> AdamW:
    """AdamW; norms (1-D) and the embedding are not decayed. Fused on CUDA. `master_weights`: see
    AdamW (train/precision.py)."""
    decay, no_decay = [], []
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        (no_decay if parameter.ndim < 2 or "embedding" in name else decay).append(parameter)
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = all(p.is_cuda for p in decay + no_decay)
    return AdamW(groups, lr=config.lr, betas=(config.beta1, config.beta2), fused=fused or None,
                 master_weights=master_weights)


def learning_rate(step: int, config: TrainConfig) -> float:
    """LR for optimizer step `step` (1-based): linear warmup, then cosine down to min_lr_ratio * lr."""
    if config.warmup_steps and step <= config.warmup_steps:
        return config.lr * step / config.warmup_steps
    span = max(config.steps - config.warmup_steps, 1)
    progress = min((step - config.warmup_steps) / span, 1.0)
    floor = config.lr * config.min_lr_ratio
    return floor + (config.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
