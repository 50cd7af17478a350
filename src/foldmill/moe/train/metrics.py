"""Training metrics: FLOPs per token, MFU, and a JSON-lines log."""

from __future__ import annotations

import json
from pathlib import Path

from foldmill.moe.config import ModelConfig


def flops_per_token(config: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token: 6 x active parameters + causal attention (6 x layers x seq x hidden)."""
    return 6.0 * config.active_params_per_token() + 6.0 * config.num_layers * seq_len * config.hidden_size


def mfu(tokens_per_second: float, config: ModelConfig, seq_len: int, peak_tflops: float) -> float:
    """Model FLOPs utilization against `peak_tflops` (per device)."""
    return tokens_per_second * flops_per_token(config, seq_len) / (peak_tflops * 1e12)


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
