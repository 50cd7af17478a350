"""Plan a fold run: skip finished targets and order the rest longest first; the records of targets over a
token budget (the scheduler rejects them once the replicas have reported their budgets).

A target id already predicted from different content that came from another input file (a second
file reusing an id) is refused with both sources named: its prediction stays, the new target gets a
`rejected` record. The same file with an edited target folds it again (the edit is the user's intent).

Longest first cuts the tail: the big targets start while every replica is free and the small
ones fill the gaps at the end, instead of one replica folding a 2,800-residue target alone. The
scheduler puts a few of the smallest in front (lead_with_small_targets) so the replicas start at once.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from foldmill.executor.records import TargetRecord
from foldmill.outputs.writer import DONE_MARKER, predictions_dir, record_name, target_dir

log = logging.getLogger(__name__)


@dataclass
class WorkItem:
    """One target on its way through the executor; `spec` is the Target's canonical JSON."""

    target_id: str
    n_tokens: int
    content_hash: str
    spec: str
    crashes: int = 0  # replica crashes while folding this target

    @property
    def input_source(self) -> tuple[str, str]:
        """(input file, record in it) the target came from, as its spec says ("" when unknown)."""
        try:
            spec = json.loads(self.spec)
        except ValueError:
            return "", ""
        return str(spec.get("source") or ""), str(spec.get("record") or "")


@dataclass
class Plan:
    todo: list[WorkItem]  # longest first
    finished: list[WorkItem] = field(default_factory=list)  # already written by an earlier run
    refused: list[TargetRecord] = field(default_factory=list)  # ids taken by a prediction of other content


def earlier_provenance(outdir: Path, target_id: str) -> dict[str, Any] | None:
    """The provenance of the target's finished prediction, or None (unfinished, or an unreadable record)."""
    directory = target_dir(outdir, target_id)
    if not (directory / DONE_MARKER).exists():
        return None
    try:
        earlier = json.loads((directory / record_name(target_id)).read_text(encoding="utf-8"))["provenance"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return earlier if isinstance(earlier, dict) else None


def id_conflict(outdir: Path, item: WorkItem, earlier: dict[str, Any] | None) -> TargetRecord | None:
    """The rejection of `item` when its id is predicted from other content taken from another input file."""
    if earlier is None or earlier.get("content_hash") in (None, item.content_hash):
        return None
    source, record = item.input_source
    earlier_source, earlier_record = str(earlier.get("input_source") or ""), str(earlier.get("input_record") or "")
    if not source or not earlier_source or earlier_source == source:
        return None  # an edit of the same input (or an origin not recorded): folded again
    reason = (
        f"target id {item.target_id} is already predicted from different content, from {earlier_source}: "
        f"{earlier_record} (this one: {source}: {record}); rename one of them, or move "
        f"{target_dir(outdir, item.target_id)} away to replace it"
    )
    return TargetRecord(item.target_id, "rejected", reason, item.n_tokens)


def _written_targets(outdir: Path) -> set[str]:
    """Ids of the target directories with a done marker: one directory listing, not a lookup per target."""
    try:
        entries = list(os.scandir(predictions_dir(outdir)))
    except (FileNotFoundError, NotADirectoryError):  # no predictions directory: nothing finished
        return set()
    return {entry.name for entry in entries if entry.is_dir() and os.path.exists(os.path.join(entry.path, DONE_MARKER))}


def plan_run(items: Iterable[WorkItem], outdir: Path, provenance: dict[str, Any]) -> Plan:
    """Split `items` into finished and todo (longest first; equal sizes keep input order).

    `provenance` holds what a finished target must match to be skipped (model, recipe); the
    target's own content_hash is matched too, so an edited target is folded again.
    """
    plan = Plan(todo=[])
    stale = 0
    written = _written_targets(outdir)
    for item in items:
        earlier = earlier_provenance(outdir, item.target_id) if item.target_id in written else None
        wanted = {**provenance, "content_hash": item.content_hash}
        if earlier is not None and all(earlier.get(key) == value for key, value in wanted.items()):
            plan.finished.append(item)
        elif (refused := id_conflict(outdir, item, earlier)) is not None:
            log.warning("%s rejected: %s", item.target_id, refused.reason)
            plan.refused.append(refused)
        else:
            stale += item.target_id in written
            plan.todo.append(item)
    plan.todo.sort(key=lambda item: -item.n_tokens)
    if stale:
        log.info("%d finished targets were made with other inputs or settings: folding them again", stale)
    return plan


# Per replica, the smallest targets that go first: a small target featurizes in about a second, a
# 2,500-residue one in ~7 s (depth-2,048 MSAs), and a replica ready before the first large target's
# features would wait for them (~7 s of an H200's start). Two small folds cover that.
LEAD_TARGETS_PER_REPLICA = 2


def lead_with_small_targets(todo: list[WorkItem], replicas: int) -> list[WorkItem]:
    """`todo` (longest first) with LEAD_TARGETS_PER_REPLICA of its smallest targets per replica moved to
    the front, smallest first; at most a quarter of the targets, so a short list stays longest first."""
    lead = min(LEAD_TARGETS_PER_REPLICA * max(replicas, 1), len(todo) // 4)
    if lead == 0:
        return list(todo)
    return todo[::-1][:lead] + todo[:-lead]


def over_budget(items: list[WorkItem], token_budget: int) -> tuple[list[WorkItem], list[TargetRecord]]:
    """(items that fit, rejection records of those that do not)."""
    fit = [item for item in items if item.n_tokens <= token_budget]
    rejected = [
        TargetRecord(
            item.target_id,
            "rejected",
            f"{item.n_tokens} tokens exceed the token budget of {token_budget} per model replica "
            "(executor.token_budget, or the estimate from device memory)",
            item.n_tokens,
        )
        for item in items
        if item.n_tokens > token_budget
    ]
    return fit, rejected
