"""The driver loop: move targets through featurize -> fold -> write with bounded queues.

Every target is a chain of three actor calls. Featurized targets and predictions stay in Ray's
object store; the driver holds only references. Each replica holds two targets at a time (one
folding, one already transferred), so it never waits on the driver between targets, and at most
`queue_depth` more per replica are featurized or being featurized: memory stays flat however long
the worklist is (`featurized_bound` targets at most).

Replicas join as they come up: the run starts while they load their models (featurizing the first
targets meanwhile), and each replica reports its token budget when it is ready. A replica takes
the largest waiting target that fits its budget; a target that fits no replica's is rejected once
every replica has reported (so a cluster of unequal GPUs gives its big targets to the big ones).

Faults: an error inside a stage comes back as an Outcome (failed / rejected / retire). A crashed
actor comes back as an actor error: Ray restarts the process (its stage is rebuilt, e.g. the
model reloaded) and the targets it held are queued again; the target it was working on is
charged a crash and failed after `max_attempts`, so a target that kills its replica cannot loop
forever. A worker reporting `retire` (a replica with a sticky CUDA error, or one that could not
rebuild its stage after a restart) is retired and its targets go to the others.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import ActorDiedError, OutOfMemoryError, RayActorError

from foldmill.errors import FoldmillError
from foldmill.executor.faults import Outcome, crash_reason
from foldmill.executor.plan import WorkItem, lead_with_small_targets, over_budget
from foldmill.executor.records import TargetRecord

log = logging.getLogger(__name__)

PER_WORKER = 2  # calls queued on one actor: one running, one ready to start
WAIT_SECONDS = 1.0  # longest pause between progress updates
PROBE_SECONDS = 0.5  # pause between checks of an actor Ray is restarting
# What a call returns when its actor's process died under it: an actor error, or, when Ray's memory
# monitor killed the process during the call, an out-of-memory error.
WORKER_LOST = (RayActorError, OutOfMemoryError)


@dataclass(eq=False)
class Slot:
    """One actor of a pool and the calls it holds, oldest (the one running) first."""

    name: str
    handle: Any
    restarts_left: int
    started: bool = False  # has built its stage (reported ready) at least once
    token_budget: int | None = None  # largest target a model replica accepts (None: any)
    inflight: deque[Ticket] = field(default_factory=deque)
    retired: bool = False
    probe: Any = None  # a `ready` call in flight while the actor starts, or restarts after a crash
    probe_after: float = 0.0  # when to probe again (monotonic), if not now
    created_at: float = field(default_factory=time.time)  # when the actor was asked for (wall clock)
    pid: int = 0  # of the actor's current process, once it reported (tells why a crashed one died)

    @property
    def restarting(self) -> bool:
        return self.probe is not None or self.probe_after > 0

    @property
    def free(self) -> bool:
        return not self.retired and not self.restarting and len(self.inflight) < PER_WORKER

    def fits(self, item: WorkItem) -> bool:
        return self.token_budget is None or item.n_tokens <= self.token_budget


@dataclass(eq=False)
class Ticket:
    """One call in flight: which target, on which actor, with what input and earlier outcomes."""

    stage: str  # featurize | fold | write
    item: WorkItem
    slot: Slot
    payload: Any  # the call's input (the work item or an object reference), kept for a resubmission
    outcome_ref: Any = None
    result_ref: Any = None
    outcomes: dict[str, Outcome] = field(default_factory=dict)  # of earlier stages


@dataclass
class Pools:
    featurizers: list[Slot]
    replicas: list[Slot]
    writers: list[Slot]

    def of(self, stage: str) -> list[Slot]:
        return {"featurize": self.featurizers, "fold": self.replicas, "write": self.writers}[stage]


@dataclass
class Waiting:
    """A target between stages: the reference to its last result and the outcomes so far."""

    item: WorkItem
    ref: Any
    outcomes: dict[str, Outcome]


class Scheduler:
    def __init__(
        self,
        pools: Pools,
        todo: list[WorkItem],
        queue_depth: int,
        max_attempts: int,
        on_record: Callable[[TargetRecord], None],
        on_fold: Callable[[Outcome], None] = lambda outcome: None,
        on_tick: Callable[[], None] = lambda: None,
        on_first_replica: Callable[[], None] = lambda: None,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> None:
        """`on_first_replica` is called when the first model replica is ready (where fold time starts);
        `should_stop` is asked at every turn of the loop (an interrupt): true, the run ends at once and
        the targets in flight get no record (a rerun folds them)."""
        self.pools = pools
        self.pending: deque[WorkItem] = deque(lead_with_small_targets(todo, len(pools.replicas)))
        self.featurized: list[Waiting] = []  # ready for a replica
        self.folded: deque[Waiting] = deque()  # ready for a writer
        self.tickets: dict[Any, Ticket] = {}  # outcome reference -> call
        self.probes: dict[Any, Slot] = {}  # `ready` reference -> starting or restarting actor
        for slot in pools.featurizers + pools.replicas + pools.writers:
            if slot.probe is not None:
                self.probes[slot.probe] = slot
        self.queue_depth = max(1, queue_depth)
        self.max_attempts = max_attempts
        self.on_record = on_record
        self.on_fold = on_fold
        self.on_tick = on_tick
        self.on_first_replica = on_first_replica
        self.should_stop = should_stop
        self.stopped = False  # ended by should_stop, with targets left
        self.checked_budget: float | None = None  # the largest replica budget `pending` was checked against
        self.peak_featurized = 0  # most featurized targets held at once (memory bound check)
        self.abort_reason = ""  # set when the run stopped early because a stage lost every worker

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> None:
        while self.pending or self.featurized or self.folded or self.tickets:
            if self.should_stop():
                self._stop()
                return
            self._check_pools()
            self._probe_restarting()
            self._dispatch()
            waiting = list(self.tickets) + list(self.probes)
            if not waiting:  # nothing in flight: every worker that could take work is restarting
                time.sleep(PROBE_SECONDS / 10)
                continue
            ready, rest = ray.wait(waiting, num_returns=1, timeout=WAIT_SECONDS)
            if ready and rest:  # take everything else already done too, without waiting
                ready += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
            for ref in ready:
                if ref in self.probes:
                    self._probed(self.probes.pop(ref))
            self._complete([self.tickets[ref] for ref in ready if ref in self.tickets])
            self.on_tick()

    def _stop(self) -> None:
        """End the run now: record the writes already finished (their targets are on disk), drop the rest."""
        self.stopped = True
        ready = ray.wait(list(self.tickets), num_returns=len(self.tickets), timeout=0)[0] if self.tickets else []
        self._complete([self.tickets[ref] for ref in ready if self.tickets[ref].stage == "write"])
        self._drain()

    def _check_pools(self) -> None:
        """Stop the run, failing what is left, when a stage has no worker left."""
        for stage, what in (("fold", "model replicas"), ("featurize", "featurize workers"), ("write", "writers")):
            if any(not slot.retired for slot in self.pools.of(stage)):
                continue
            self.abort_reason = f"all {what} were retired after repeated crashes or CUDA errors"
            for item in self._drain():
                self.on_record(TargetRecord(item.target_id, "failed", self.abort_reason, item.n_tokens, attempts=item.crashes + 1))
            return

    def _drain(self) -> list[WorkItem]:
        """Take every target not finished yet out of the queues."""
        items = list(self.pending) + [w.item for w in self.featurized] + [w.item for w in self.folded]
        items += [ticket.item for ticket in self.tickets.values()]
        self.pending.clear()
        self.featurized.clear()
        self.folded.clear()
        self.tickets.clear()
        return items

    # -- dispatch ---------------------------------------------------------------------------
    def _dispatch(self) -> None:
        alive_replicas = sum(not slot.retired for slot in self.pools.replicas)
        depth = self.queue_depth * alive_replicas
        while self.folded and (slot := self._free("write")):
            waiting = self.folded.popleft()
            self._submit("write", waiting.item, slot, waiting.ref, waiting.outcomes)
        self._reject_oversized()
        # Hold no more predictions than the writers can take next, so a slow disk throttles folding.
        writers_keep_up = len(self.folded) < PER_WORKER * len(self.pools.writers)
        while writers_keep_up and self.featurized and (pick := self._next_fold()):
            slot, waiting = pick
            self.featurized.remove(waiting)
            self._submit("fold", waiting.item, slot, waiting.ref, waiting.outcomes)
        while self.pending and self._featurized_ready() < depth and (slot := self._free("featurize")):
            item = self.pending.popleft()
            self._submit("featurize", item, slot, item, {})
        self.peak_featurized = max(self.peak_featurized, self._featurized_held())

    def _next_fold(self) -> tuple[Slot, Waiting] | None:
        """The free replica with the fewest calls that fits a waiting target, and the largest it fits."""
        for slot in sorted((slot for slot in self.pools.replicas if slot.free), key=lambda slot: len(slot.inflight)):
            fitting = [waiting for waiting in self.featurized if slot.fits(waiting.item)]
            if fitting:
                return slot, max(fitting, key=lambda w: w.item.n_tokens)
        return None

    def _largest_budget(self) -> float | None:
        """The largest target some replica accepts; None while a replica has not reported its budget."""
        alive = [slot for slot in self.pools.replicas if not slot.retired]
        if not alive or not all(slot.started for slot in alive):
            return None
        return max(math.inf if slot.token_budget is None else slot.token_budget for slot in alive)

    def _reject_oversized(self) -> None:
        """Reject the targets no replica can take, once every replica has said what it takes. The
        queue is checked again only when that changes (a replica retired), so a long one costs once."""
        budget = self._largest_budget()
        if budget is None or budget == math.inf:
            return
        if budget != self.checked_budget:
            self.checked_budget = budget
            fit, rejected = over_budget(list(self.pending), int(budget))
            self.pending = deque(fit)
            for record in rejected:
                self.on_record(record)
        too_big = [waiting for waiting in self.featurized if waiting.item.n_tokens > budget]
        for waiting in too_big:
            self.featurized.remove(waiting)
            for record in over_budget([waiting.item], int(budget))[1]:
                self.on_record(record)

    @property
    def featurized_bound(self) -> int:
        """The most featurized targets alive at once: `queue_depth` ready and PER_WORKER on each replica."""
        return (self.queue_depth + PER_WORKER) * len(self.pools.replicas)

    def _featurized_ready(self) -> int:
        """Featurized targets waiting for a replica, or being made."""
        return len(self.featurized) + sum(ticket.stage == "featurize" for ticket in self.tickets.values())

    def _featurized_held(self) -> int:
        """Featurized targets alive: waiting, being made, or sitting on a replica."""
        return self._featurized_ready() + sum(ticket.stage == "fold" for ticket in self.tickets.values())

    def _free(self, stage: str) -> Slot | None:
        free = [slot for slot in self.pools.of(stage) if slot.free]
        return min(free, key=lambda slot: len(slot.inflight)) if free else None

    def _submit(self, stage: str, item: WorkItem, slot: Slot, payload: Any, outcomes: dict[str, Outcome]) -> None:
        ticket = Ticket(stage, item, slot, payload, outcomes=outcomes)
        ticket.outcome_ref, ticket.result_ref = slot.handle.process.remote(payload)
        slot.inflight.append(ticket)
        self.tickets[ticket.outcome_ref] = ticket

    # -- completion -------------------------------------------------------------------------
    def _complete(self, tickets: list[Ticket]) -> None:
        """Settle finished calls: their outcomes (and writers' prediction directories) in one `ray.get`.
        When an actor died under one of them, each is settled on its own so the others keep theirs."""
        writes = [ticket for ticket in tickets if ticket.stage == "write"]
        try:
            values = ray.get([ticket.outcome_ref for ticket in tickets] + [ticket.result_ref for ticket in writes])
        except WORKER_LOST:
            for ticket in tickets:
                self._settle_alone(ticket)
            return
        prediction_dirs = iter(values[len(tickets) :])  # the writes' own, in the order of `tickets`
        for ticket, outcome in zip(tickets, values, strict=False):
            prediction_dir = next(prediction_dirs) if ticket.stage == "write" else None
            if self.tickets.pop(ticket.outcome_ref, None) is not None:  # not dropped by a crash or retirement before
                self._settle(ticket, outcome, prediction_dir)

    def _settle_alone(self, ticket: Ticket) -> None:
        if self.tickets.pop(ticket.outcome_ref, None) is None:  # dropped when its actor's crash was handled
            return
        try:
            outcome: Outcome = ray.get(ticket.outcome_ref)
            prediction_dir = ray.get(ticket.result_ref) if ticket.stage == "write" else None
        except WORKER_LOST as error:
            self._actor_crashed(ticket.slot, error)
            return
        self._settle(ticket, outcome, prediction_dir)

    def _settle(self, ticket: Ticket, outcome: Outcome, prediction_dir: Any) -> None:
        """Move a target on after one of its stages finished: to the next stage, or to its record."""
        ticket.slot.inflight.remove(ticket)
        outcomes = {**ticket.outcomes, ticket.stage: outcome}
        if ticket.stage == "fold":
            self.on_fold(outcome)
        if outcome.status == "retire":
            self._retire(ticket, outcome)
        elif outcome.status != "ok":
            status = "rejected" if outcome.status == "rejected" else "failed"
            log.warning("%s %s at %s on %s: %s", ticket.item.target_id, status, ticket.stage, outcome.worker, outcome.reason)
            if "traceback" in outcome.info:
                log.warning("%s", outcome.info["traceback"])
            self._record(ticket.item, status, f"{ticket.stage}: {outcome.reason}", outcomes)
        elif ticket.stage == "featurize":
            self.featurized.append(Waiting(ticket.item, ticket.result_ref, outcomes))
        elif ticket.stage == "fold":
            self.folded.append(Waiting(ticket.item, ticket.result_ref, outcomes))
        else:
            self._record(ticket.item, "ok", "", outcomes, prediction_dir=str(prediction_dir))

    def _record(self, item: WorkItem, status: str, reason: str, outcomes: dict[str, Outcome], prediction_dir: str = "") -> None:
        fold = outcomes.get("fold", Outcome("ok"))
        self.on_record(
            TargetRecord(
                item.target_id,
                status,
                reason,
                item.n_tokens,
                seconds=fold.seconds,
                replica=fold.worker,
                prediction_dir=prediction_dir,
                featurize_seconds=outcomes.get("featurize", Outcome("ok")).seconds,
                write_seconds=outcomes.get("write", Outcome("ok")).seconds,
                fold_started=fold.started,
                fold_finished=fold.started + fold.seconds if fold.started else 0.0,
                attempts=item.crashes + 1,
                model_stages=fold.info.get("stages", {}),
            )
        )

    def _requeue(self, ticket: Ticket) -> None:
        """Give a call that its actor lost to another actor of the same stage."""
        self.tickets.pop(ticket.outcome_ref, None)
        if ticket.stage == "featurize":
            self.pending.appendleft(ticket.item)
        elif ticket.stage == "fold":
            self.featurized.append(Waiting(ticket.item, ticket.payload, ticket.outcomes))
        else:
            self.folded.appendleft(Waiting(ticket.item, ticket.payload, ticket.outcomes))

    def _release(self, slot: Slot, culprit_reason: str) -> None:
        """Requeue every call `slot` held; the oldest (the one running) is charged a crash."""
        for position, ticket in enumerate(list(slot.inflight)):
            if position == 0:
                ticket.item.crashes += 1
                if ticket.item.crashes >= self.max_attempts:
                    self.tickets.pop(ticket.outcome_ref, None)
                    reason = f"{ticket.stage}: {culprit_reason} ({ticket.item.crashes} times with this target)"
                    self._record(ticket.item, "failed", reason, ticket.outcomes)
                    continue
            self._requeue(ticket)
        slot.inflight.clear()

    def _actor_crashed(self, slot: Slot, error: Exception) -> None:
        """An actor died under its calls: requeue them and wait (probing) until Ray has restarted it."""
        reason = crash_reason(slot.pid, slot.inflight[0].item.n_tokens if slot.inflight else 0)
        log.warning("%s crashed (%s); its %d target(s) go back to the queue", slot.name, reason, len(slot.inflight))
        self._release(slot, reason)
        slot.restarts_left -= 1
        if slot.restarts_left < 0:
            log.warning("%s crashed too often: retired", slot.name)
            slot.retired = True
        else:
            slot.probe_after = time.monotonic()
            slot.created_at = time.time()  # Ray starts a new process now

    def _probe_restarting(self) -> None:
        now = time.monotonic()
        for stage in ("featurize", "fold", "write"):
            for slot in self.pools.of(stage):
                if not slot.retired and slot.probe is None and 0 < slot.probe_after <= now:
                    slot.probe = slot.handle.ready.remote()
                    self.probes[slot.probe] = slot

    def _probed(self, slot: Slot) -> None:
        """A starting or restarting actor answered `ready` (or is still restarting)."""
        try:
            report = ray.get(slot.probe)
            slot.probe_after = 0.0
            if report["error"] and not slot.started:  # a replica that cannot load its model: stop the run
                raise FoldmillError(f"{report['name']} could not start: {report['error']}")
            if report["error"]:
                log.warning("%s restarted but could not start again: retired (%s)", slot.name, report["error"])
                slot.retired = True
                ray.kill(slot.handle, no_restart=True)
            else:
                first = not slot.started
                slot.name, slot.token_budget, slot.started = report["name"], report["token_budget"], True
                slot.pid = report["pid"]
                split = ", ".join(f"{part} {seconds:.1f}" for part, seconds in report["build_split"].items())
                built = f"process up in {report['started_at'] - slot.created_at:.1f} s, stage built in "
                built += f"{report['build_seconds']:.1f} s" + (f" ({split})" if split else "")
                if not first:
                    log.info("%s is back (%s)", slot.name, built)
                else:
                    log.info("%s ready: %s, token budget %s", slot.name, built, slot.token_budget)
                    if sum(replica.started for replica in self.pools.replicas) == 1:
                        self.on_first_replica()
        except ActorDiedError as error:
            log.warning("%s cannot be restarted: retired (%s)", slot.name, error)
            slot.retired = True
        except WORKER_LOST:
            slot.probe_after = time.monotonic() + PROBE_SECONDS  # still restarting
        slot.probe = None

    def _retire(self, ticket: Ticket, outcome: Outcome) -> None:
        """A worker that can no longer work (sticky CUDA error, or no stage after a restart) goes;
        its targets go to the others, the one it was on charged an attempt."""
        slot = ticket.slot
        log.error("%s retired on %s: %s", slot.name, ticket.item.target_id, outcome.reason)
        slot.inflight.appendleft(ticket)
        slot.retired = True
        self._release(slot, f"its {ticket.stage} worker was retired: {outcome.reason}")
        ray.kill(slot.handle, no_restart=True)
