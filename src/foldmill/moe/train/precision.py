"""How each moe.precision stores the model's parameters.

fp32: float32 throughout. bf16: bf16 parameters and AdamW states. bf16-mixed: float32 parameters
and AdamW states, the passes in bf16 under autocast.

In one process, bf16-mixed stores the experts' weights (nearly all of a MoE model's parameters)
in bf16 and keeps their float32 values as masters, which foldmill's AdamW updates and rounds into
the bf16 weights. The passes then read the bf16 weights instead of casting every float32 weight
on every step, and the experts' gradients stay bf16 instead of being converted to float32 for the
optimizer (at bio_8x1b size both casts move about 19 GB per step). The arithmetic is the same: the
passes multiply the same bf16 values, and the update reads the same gradient values (converting a
bf16 gradient to float32 is exact) into the same float32 arithmetic. Checkpoints hold the masters,
so they are the same float32 weights either way. Runs of several processes keep float32 weights,
so that their all-reduces sum the experts' gradients in float32.
"""

from __future__ import annotations

import torch
from torch import nn

from foldmill.moe.model.moe import Experts


def prepare_parameters(model: nn.Module, precision: str, processes: int = 1) -> dict[nn.Parameter, torch.Tensor]:
    """Store `model`'s parameters (in place) as `precision` trains them; returns the float32 masters
    of the weights stored in bf16 (bf16-mixed in one process, where the experts are never split),
    for the optimizer, else {}."""
    if precision == "bf16":
        model.to(torch.bfloat16)
        return {}
    if precision == "bf16-mixed" and processes == 1:
        return experts_in_bf16(model)
    return {}


def experts_in_bf16(model: nn.Module) -> dict[nn.Parameter, torch.Tensor]:
    """Store every float32 expert weight in bf16 (the same Parameter objects); returns
    {weight: its float32 values}."""
    masters = {}
    for module in model.modules():
        if not isinstance(module, Experts):
            continue
        for weight in module.parameters(recurse=False):
            if weight.dtype != torch.float32:
                continue
            masters[weight] = weight.detach().clone(memory_format=torch.contiguous_format)
            weight.data = weight.data.to(torch.bfloat16)
    return masters
