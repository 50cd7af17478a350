"""The language-model loss of one batch: next-token cross-entropy plus the weighted router loss; the
gradients of an optimizer step's micro-batches."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
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


def accumulate_gradients(loss_fn: Callable[[torch.Tensor], Sequence[torch.Tensor]], batch: torch.Tensor,
                         micro_batches: int = 1,
                         defer_sync: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
                         ) -> tuple[torch.Tensor, ...]:
    """Forward and backward passes over `batch` split into `micro_batches` equal parts, one after the
    other, so only one part's activations are alive at a time. loss_fn(part) -> (loss, *metrics).

    The parameters' gradients become those of the mean of the parts' losses (summed into .grad in
    the gradients' own dtype); returns the mean of each of loss_fn's outputs over the parts,
    detached. Every part but the last runs inside defer_sync() (DDP's no_sync), so that gradients
    are reduced across processes once per optimizer step.
    """
    if batch.shape[0] % micro_batches:
        raise ValueError(f"a batch of {batch.shape[0]} sequences does not split into {micro_batches} equal micro-batches")
    parts = batch.chunk(micro_batches)
    totals: list[torch.Tensor] = []
    for index, part in enumerate(parts):
        # DDP decides in the forward pass whether the backward pass reduces.
        with defer_sync() if index < micro_batches - 1 else contextlib.nullcontext():
            outputs = loss_fn(part)
            (outputs[0] if micro_batches == 1 else outputs[0] / micro_batches).backward()
        detached = [output.detach() for output in outputs]
        totals = detached if not totals else [total + value for total, value in zip(totals, detached)]
    return tuple(total if micro_batches == 1 else total / micro_batches for total in totals)
