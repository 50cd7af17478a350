"""The seeded random-weight `demo` model: runs the whole pipeline without published weights.

Its structures and confidences are meaningless; `provenance["model"] == "demo"` marks every
output made with it. The same seed and config always give the same weights.
"""

from __future__ import annotations

import torch
from torch import nn

from foldmill.model.boltz2 import Boltz2
from foldmill.model.config import Boltz2Config

DEMO_NOTE = "random weights: not a structure prediction"


@torch.no_grad()
def randomize_weights(model: nn.Module, seed: int) -> None:
    """Overwrite every parameter with seeded random values that keep each layer active, drawn on the
    parameters' device (the same seed gives the same weights on the same kind of device).

    Matrices get N(0, 1/fan_in); vectors (norm scales, biases, learned encodings) get
    1 + N(0, 0.1^2) for norm scales and N(0, 0.1^2) otherwise. Unlike a training
    initialisation, no projection is zero, so every path of the model carries signal.
    """
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    for name, parameter in model.named_parameters():
        values = torch.randn(parameter.shape, generator=generator, dtype=torch.float32, device=device)
        if parameter.dim() >= 2:
            values = values / parameter.shape[1] ** 0.5
        elif _is_norm_scale(model, name):
            values = 1 + 0.1 * values
        else:
            values = 0.1 * values
        parameter.copy_(values)


def _is_norm_scale(model: nn.Module, name: str) -> bool:
    module_name, _, attribute = name.rpartition(".")
    return attribute == "weight" and isinstance(model.get_submodule(module_name), nn.LayerNorm)


def demo_model(config: Boltz2Config | None = None, seed: int = 0, device: torch.device | str = "cpu") -> Boltz2:
    """A Boltz2 with seeded random weights (default: the small test configuration), in eval mode, made
    on `device` (a GPU builds and draws the full-size model in well under a second)."""
    config = config or Boltz2Config.small()
    device = torch.device(device)
    weights = f"random, seed {seed}" + ("" if device.type == "cpu" else f", drawn on {device.type}")
    with device:
        model = Boltz2(config, provenance={"model": "demo", "weights": weights, "note": DEMO_NOTE})
    randomize_weights(model, seed)
    return model.eval()
