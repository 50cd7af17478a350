"""Training metrics: FLOPs per token, MFU against the GPU's spec peaks, and a JSON-lines log."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from foldmill.io.atomic import write_text_atomic
from foldmill.moe.config import ModelConfig
from foldmill.moe.experts import GEMM_PRECISION
from foldmill.moe.model.attention import attended_pairs

# Dense tensor-core peaks, TFLOP/s per GPU: NVIDIA's datasheet figures without sparsity (half of
# those quoted "with sparsity"). MFU is held against these, not against a rate measured on one
# machine, so that runs on different GPUs and hosts compare.
HOPPER_SXM_PEAKS = {"bf16": 989.0, "fp8": 1979.0}  # H100 SXM, H200 SXM, GH200
HOPPER_NVL_PEAKS = {"bf16": 835.5, "fp8": 1670.5}  # H100 NVL, H200 NVL
H100_PCIE_PEAKS = {"bf16": 756.5, "fp8": 1513.0}
A100_PEAKS = {"bf16": 312.0}  # no FP8 tensor cores


def spec_peaks(device_name: str) -> dict[str, float]:
    """The dense peaks of the GPU that torch names `device_name`, {} for a GPU not listed here."""
    name = device_name.upper()
    if "A100" in name:
        return dict(A100_PEAKS)
    if "H100" in name or "H200" in name:  # GH200 included
        if "NVL" in name:
            return dict(HOPPER_NVL_PEAKS)
        return dict(H100_PCIE_PEAKS if "PCIE" in name else HOPPER_SXM_PEAKS)
    return {}


def run_peaks(device: torch.device, peak_tflops: float = 0.0) -> dict[str, float]:
    """The peaks a run's MFU is held against: {"bf16": peak_tflops} where it is set (> 0), else the
    spec peaks of `device`'s GPU; {} on the CPU or a GPU not in spec_peaks."""
    if peak_tflops > 0:
        return {"bf16": peak_tflops}
    if device.type != "cuda":
        return {}
    return spec_peaks(torch.cuda.get_device_name(device))


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


def mfu_columns(tokens_per_second: float, config: ModelConfig, seq_len: int, peaks: dict[str, float],
                attended_fraction: float = 1.0) -> dict[str, float | None]:
    """{"mfu": against the bf16 peak}, and for 8-bit expert backends also "mfu_fp8" against the FP8
    peak (foldmill bench moe's mfu_bf16_spec and mfu_spec); None where `peaks` lacks the peak."""
    columns = {"mfu": "bf16"}
    if GEMM_PRECISION.get(config.expert_backend) == "fp8":
        columns["mfu_fp8"] = "fp8"
    return {column: mfu(tokens_per_second, config, seq_len, peaks[precision], attended_fraction)
            if peaks.get(precision) else None for column, precision in columns.items()}


class MetricsLog:
    """Appends one JSON object per line; a resumed run continues the same file from its step."""

    def __init__(self, path: str | Path, enabled: bool = True) -> None:
        self.path = Path(path)
        self.enabled = enabled
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: dict) -> None:
        if self.enabled:
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(record, sort_keys=True) + "\n")

    def keep_up_to(self, step: int) -> list[dict]:
        """The records logged up to `step`, the step a run resumes from. The main process also drops
        from the file what a stopped run logged after it, and any line cut short: the resumed run
        logs those steps again, so the file reads as one uninterrupted run."""
        if not self.path.is_file():
            return []
        text = self.path.read_text(encoding="utf-8")
        kept = []
        for line in text.splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and record.get("step", 0) <= step:
                kept.append(record)
        kept_text = "".join(json.dumps(record, sort_keys=True) + "\n" for record in kept)
        if self.enabled and kept_text != text:
            write_text_atomic(self.path, kept_text)
        return kept
