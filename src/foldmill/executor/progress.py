"""Live progress of a fold run and its closing summary.

On a terminal the progress line redraws in place about once a second; otherwise (a Snakemake log,
a Slurm output file) it is logged every `interval` seconds. Residues are counted as tokens (one per
polymer residue, one per ligand atom). Replica utilization is the share of time each replica spent
inside the model (host-to-device copies included): the GPU busy time the executor controls.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import TextIO

from foldmill.executor.faults import Outcome
from foldmill.executor.records import TargetRecord

log = logging.getLogger(__name__)


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"


@dataclass
class Progress:
    total_targets: int
    total_tokens: int
    interval: float = 30.0
    stream: TextIO = field(default_factory=lambda: sys.stderr)
    started: float = field(default_factory=time.monotonic)
    statuses: Counter = field(default_factory=Counter)
    tokens_done: int = 0
    busy: defaultdict = field(default_factory=lambda: defaultdict(float))  # replica -> seconds in the model
    last_fold: dict = field(default_factory=dict)  # replica -> when its latest fold finished (monotonic)
    folding: bool = False  # a model replica is up (before, the line says the models are loading)
    _last_shown: float = 0.0

    @property
    def live(self) -> bool:
        return self.stream.isatty()

    def start_folding(self) -> None:
        """The first replica is up: rates and utilization count from now, not from model loading."""
        self.started = time.monotonic()
        self.folding = True

    def fold_finished(self, outcome: Outcome) -> None:
        self.busy[outcome.worker] += outcome.seconds
        self.last_fold[outcome.worker] = time.monotonic()

    def utilization(self, replica: str) -> float:
        """Share of the time up to the replica's latest finished fold spent in the model (a fold in
        progress counts once it finishes, so this never reads low just because a long target is running)."""
        window = self.last_fold[replica] - self.started
        return min(1.0, self.busy[replica] / window) if window > 0 else 0.0

    def record(self, record: TargetRecord) -> None:
        self.statuses[record.status] += 1
        self.tokens_done += record.n_tokens

    def tick(self) -> None:
        now = time.monotonic()
        if now - self._last_shown < (1.0 if self.live else self.interval):
            return
        self._last_shown = now
        if self.live:
            self.stream.write("\r" + self.line()[:200].ljust(120))
            self.stream.flush()
        else:
            log.info("%s", self.line())

    def finish(self) -> None:
        if self.live:
            self.stream.write("\r" + self.line()[:200].ljust(120) + "\n")
            self.stream.flush()

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        done = sum(self.statuses.values())
        rate = self.tokens_done / elapsed
        left = self.total_tokens - self.tokens_done
        eta = format_duration(left / rate) if rate > 0 else "?"
        problems = ", ".join(f"{self.statuses[s]} {s}" for s in ("failed", "rejected") if self.statuses[s])
        use = " ".join(f"{name} {100 * self.utilization(name):.0f}%" for name in sorted(self.busy))
        return (
            f"fold {done}/{self.total_targets} targets{f' ({problems})' if problems else ''} | "
            f"{self.tokens_done:,}/{self.total_tokens:,} residues | {rate:,.1f} residues/s | "
            f"ETA {eta} | {use or ('first targets folding' if self.folding else 'models loading')}"
        )


def summary_text(
    records: list[TargetRecord], resumed: set[str], wall_seconds: float, fold_seconds: float, busy: dict[str, float]
) -> str:
    """The closing table: counts by status, throughput, per-replica work, and the failures.

    Rates use `fold_seconds` (from the first target handed out to the last written: Ray and model
    start-up excluded); `wall_seconds` is the whole run.
    """
    statuses = Counter(record.status for record in records)
    folded = [r for r in records if r.status == "ok" and r.target_id not in resumed]
    tokens = sum(r.n_tokens for r in folded)
    wall = max(fold_seconds, 1e-9)
    replicas = max(len(busy), 1)
    lines = [
        f"fold run: {len(records)} targets in {format_duration(wall_seconds)} — "
        f"ok {statuses['ok']} ({len(resumed)} from earlier runs), failed {statuses['failed']}, rejected {statuses['rejected']}",
        f"folded now: {len(folded)} targets, {tokens:,} residues in {format_duration(fold_seconds)}, "
        f"{tokens / wall:,.1f} residues/s, {tokens * 3600 / wall / replicas:,.0f} residues per replica-hour",
    ]
    if busy:
        per_replica: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for record in folded:
            per_replica[record.replica][0] += 1
            per_replica[record.replica][1] += record.n_tokens
        width = max(len(name) for name in busy)
        lines.append(f"  {'replica'.ljust(width)}  targets  residues  busy")
        for name in sorted(busy):
            count, residues = per_replica[name]
            lines.append(f"  {name.ljust(width)}  {count:7d}  {residues:8,d}  {100 * busy[name] / wall:3.0f}%")
    problems = [r for r in records if r.status != "ok"]
    for record in problems[:10]:
        lines.append(f"  {record.status} {record.target_id}: {record.reason}")
    if len(problems) > 10:
        lines.append(f"  ... and {len(problems) - 10} more (see the fold table)")
    return "\n".join(lines)
