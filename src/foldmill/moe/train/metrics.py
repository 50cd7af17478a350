"""Training metrics: FLOPs per token, MFU, and a JSON-lines log."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from foldmill.moe.config import ModelConfig
from foldmill.moe.model.attention import attended_pairs


def flops_per_token(config: ModelConfig, seq_len: int, attended_fraction: float = 1.0) -> float:
    """Training FLOPs per token: 6 x active parameters + attention: 6 x layers x seq x hidden over
    causal windows, times the fraction of their query-key pairs a document mask keeps."""
    attention = 6.0 * config.num_layers * seq_len * config.hidden_size * attended_fraction
    return 6.0 * config.active_params_per_token() + attention


def attended_fraction(document_ids: torch.Tensor) -> float:
    """The fraction of causal windows' query-key pairs that attention within the records of
    `document_ids` (batch, seq) keeps."""
    batch, seq = document_ids.shape
    return attended_pairs(document_ids) / (batch * seq * (seq + 1) / 2)


def mfu(tokens_per_second: float, config: ModelConfig, seq_len: int, peak_tflops: float,
        attended_fraction: float = 1.0) -> float:
    """Model FLOPs utilization against `peak_tflops` (per device); `attended_fraction`: of the
    causal attention's pairs (document masking computes fewer)."""
    return tokens_per_second * flops_per_token(config, seq_len, attended_fraction) / (peak_tflops * 1e12)


class MetricsLog:
    """Appends one JSON object per line (a resumed run continues the same file)."""

    def __init__(self, path: str | Path, enabled: bool = True) -> None:
        self.path = Path(path)
        self.enabled = enabled
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: dict) -> None:
        if self.enabled:
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(record, sort_keys=True) + "\n")
