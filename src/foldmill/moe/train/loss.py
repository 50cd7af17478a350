"""The language-model loss of one batch: next-token cross-entropy plus the weighted router loss."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from foldmill.moe.data.loader import document_ids
from foldmill.moe.data.tokenizers import PAD


@dataclass
class BatchLoss:
    loss: torch.Tensor  # what backward() is called on
    cross_entropy: torch.Tensor  # mean over predicted tokens
    aux_loss: torch.Tensor
    expert_load: torch.Tensor  # (layers, experts)


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """bf16 autocast for the bf16-mixed recipe (fp32 master weights), else nothing."""
    if precision == "bf16-mixed":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def batch_loss(model: nn.Module, batch: torch.Tensor, precision: str, aux_loss_coef: float) -> BatchLoss:
    """batch (B, seq_len + 1) token ids: inputs are [:, :-1], targets [:, 1:] (padding ignored).

    The records packed in each window are masked from each other (document_ids).
    """
    inputs, targets = batch[:, :-1], batch[:, 1:]
    with autocast(batch.device, precision):
        output = model(inputs, document_ids(inputs))
    cross_entropy = F.cross_entropy(output.logits.float().flatten(0, 1), targets.flatten(), ignore_index=PAD)
    loss = cross_entropy + aux_loss_coef * output.aux_loss if aux_loss_coef else cross_entropy
    return BatchLoss(loss, cross_entropy, output.aux_loss, output.expert_load)
