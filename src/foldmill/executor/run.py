"""Fold a list of targets end to end: plan, start Ray and the actor pools, schedule, record, summarize.

This is the one entry point the `fold` rule, `foldmill fold` and `foldmill bench throughput` share.
"""

from __future__ import annotations

import functools
import logging
import signal
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from foldmill.executor.cluster import ray_session, ray_temp_dir, start_pools, stop_pools
from foldmill.executor.engine import Engine, FeaturizeStage, Staging, WriteStage, kernel_cache_dir, run_provenance
from foldmill.executor.interrupts import FoldInterrupted, stop_on_signals
from foldmill.executor.plan import WorkItem, plan_run
from foldmill.executor.progress import Progress, summary_text
from foldmill.executor.records import Journal, TargetRecord, journal_path, write_fold_table
from foldmill.executor.scheduler import Scheduler
from foldmill.executor.settings import ExecutorSettings, ModelSettings
from foldmill.io.worklist import read_worklist_table
from foldmill.outputs.writer import target_dir

log = logging.getLogger(__name__)


@dataclass
class OutputSettings:
    top_k: int | None = None  # ranked samples written per target (None = all)
    write_pdb: bool = False


@dataclass
class RunResult:
    records: list[TargetRecord]  # one per target, in input order
    resumed: set[str]  # finished by an earlier run
    wall_seconds: float  # the whole run
    fold_seconds: float  # from the first model replica's start to the end (Ray and model start-up excluded)
    busy: dict[str, float]  # replica -> seconds in the model
    peak_featurized: int = 0  # most featurized targets held at once
    abort_reason: str = ""  # non-empty when the run stopped early (no replica left)
    summary: str = field(default="", repr=False)

    def count(self, status: str) -> int:
        return sum(record.status == status for record in self.records)


def work_items(table: pd.DataFrame) -> list[WorkItem]:
    """Work items from worklist (or shard) rows."""
    return [
        WorkItem(str(row.target_id), int(row.n_tokens), str(row.content_hash), str(row.spec))
        for row in table.itertuples(index=False)
    ]


def read_work_items(path: str | Path) -> list[WorkItem]:
    """Work items of a worklist or shard table (TSV or Parquet, as foldmill writes them)."""
    return work_items(read_worklist_table(path, ("target_id", "n_tokens", "content_hash", "spec")))


def replica_memory_share(model: ModelSettings, executor: ExecutorSettings) -> float:
    """Share of its device's memory a replica may plan for: CPU replicas split the host's."""
    return 1.0 / max(1, executor.cpu_replicas) if model.device == "cpu" else 1.0


def fold_targets(
    items: list[WorkItem],
    outdir: Path,
    table: Path,
    model: ModelSettings,
    executor: ExecutorSettings,
    staging: Staging,
    outputs: OutputSettings | None = None,
) -> RunResult:
    """Fold `items` into OUTDIR/predictions, write the fold table `table`, return the run's records."""
    outputs = outputs or OutputSettings()
    started = time.monotonic()
    if model.is_demo:
        log.warning("%s", model.announcement())
    log.info("%s", model.describe())
    provenance = run_provenance(model)
    plan = plan_run(items, outdir, provenance)
    journal = journal_path(table)
    earlier = Journal.read(journal)
    records: dict[str, TargetRecord] = {}
    for item in plan.finished:
        record = earlier.get(item.target_id)
        if record is None or record.status != "ok":
            record = TargetRecord(item.target_id, "ok", "", item.n_tokens)
        record.prediction_dir = str(target_dir(outdir, item.target_id))
        records[item.target_id] = record
    for record in plan.refused:
        records[record.target_id] = record
    log.info("%d targets: %d finished earlier, %d to fold (%d tokens)", len(items), len(plan.finished), len(plan.todo), sum(i.n_tokens for i in plan.todo))
    progress = Progress(len(plan.todo), sum(item.n_tokens for item in plan.todo), interval=executor.progress_seconds)
    scheduler = None
    fold_seconds = 0.0
    with stop_on_signals() as stop, _counted_on_interrupt(records, len(items)):
        if plan.todo:
            run_id = uuid.uuid4().hex[:12]
            with ray_session(executor, *ray_temp_dir(executor, outdir, run_id)), Journal(journal) as out:
                stop.install()

                def keep(record: TargetRecord) -> None:
                    record.run = run_id
                    records[record.target_id] = record
                    out.append(record)
                    progress.record(record)

                pools = start_pools(
                    executor,
                    model.device,
                    functools.partial(FeaturizeStage, staging, model),
                    functools.partial(
                        Engine,
                        model,
                        executor.token_budget,
                        replica_memory_share(model, executor),
                        provenance,
                        kernel_cache_dir(model, outdir),
                    ),
                    functools.partial(WriteStage, outdir, outputs.top_k, outputs.write_pdb),
                    run_id,
                )
                try:
                    scheduler = Scheduler(
                        pools,
                        plan.todo,
                        executor.queue_depth,
                        executor.max_attempts,
                        keep,
                        progress.fold_finished,
                        progress.tick,
                        progress.start_folding,
                        should_stop=lambda: bool(stop),
                    )
                    stop.deferred = True  # from here the loop polls the request, at least once a second
                    scheduler.run()
                    fold_seconds = time.monotonic() - progress.started
                    progress.finish()
                finally:
                    stop_pools(pools)
                if scheduler.stopped:
                    raise FoldInterrupted(stop.signum or signal.SIGINT)
    ordered = [records[item.target_id] for item in items if item.target_id in records]
    write_fold_table(ordered, table)
    result = RunResult(
        ordered,
        {item.target_id for item in plan.finished},
        time.monotonic() - started,
        fold_seconds,
        dict(progress.busy),
        scheduler.peak_featurized if scheduler else 0,
        scheduler.abort_reason if scheduler else "",
    )
    result.summary = summary_text(result.records, result.resumed, result.wall_seconds, result.fold_seconds, result.busy)
    log.info("%s", result.summary)
    return result


@contextmanager
def _counted_on_interrupt(records: dict[str, TargetRecord], total: int) -> Iterator[None]:
    """An interrupt leaving the block says how many of the `total` targets are done (and kept)."""
    try:
        yield
    except FoldInterrupted as interrupted:
        done = sum(record.status == "ok" for record in records.values())
        raise FoldInterrupted(interrupted.signum, done, total) from None
