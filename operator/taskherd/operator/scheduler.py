"""Polls every known WorkerPool at its own interval, from one loop.

kopf's daemons and timers would work too, but they put a finalizer on every WorkerPool (so a pool
cannot be deleted while the operator is down) and fix one interval per handler. Here a kopf event
handler keeps `upsert`/`remove` in step with the API, and one loop runs whichever polls are due,
a bounded number at a time, only while this replica holds the leader Lease. The polls started
together form one round, summed up in one log line when the round ends (kube-janitor's
`completed: k=v` line): `poll completed: pools=3 scaled=1 paged=0 errors=0`.

Two pools of one namespace whose scaleTargetRef names one object (API group, kind, name) would
fight over its replicas: the scheduler keeps an index of the pools by target and polls all but the
oldest of them (creationTimestamp, then name) with a ScaleTargetConflict, so that only the oldest
scales it; the others report Ready=False until the conflict ends (plan._plan_conflict).

Between polls, the early notice (early_notice.py) counts the ready messages of the Redis pools
every second and brings forward the poll of a pool that a burst has outgrown.
"""
from __future__ import annotations

import asyncio
import copy
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .early_notice import PROBE_SECONDS, Candidate, ReadyCountsFn, candidate, outgrows
from .plan import PoolMemory, Problem
from .policy import DEFAULT_POLL_INTERVAL_SECONDS, InvalidSpec, PoolSpec, parse_spec_cached
from .poll import Deps, PollResult, poll_once

log = logging.getLogger("taskherd.operator")

#: how often the loop looks for due polls; adds at most this much to the reaction time.
TICK_SECONDS = 0.25
#: polls running at once (each mostly waits on the broker and the API).
DEFAULT_CONCURRENCY = 16

Key = tuple[str, str]
#: what a scaleTargetRef names in a namespace: (namespace, API group, kind, name); the version
#: is left out (apps/v1 and apps/v1beta2 name one Deployment).
TargetKey = tuple[str, str, str, str]


def _spec(body: Mapping[str, Any]) -> PoolSpec | None:
    """The pool's parsed spec, None when it is invalid (its poll reports why)."""
    try:
        return parse_spec_cached(body.get("spec") or {})
    except Exception:  # noqa: BLE001 - InvalidSpec, or any other refusal: the poll reports it
        return None


def poll_interval(body: Mapping[str, Any]) -> float:
    """spec.pollIntervalSeconds as the poll reads it (policy.parse_spec: a whole number 1-300);
    the default when the spec is invalid. Never the raw value: "inf" or 1e-9 from a spec the
    policy refuses would stop the pool's polls, or poll it at every tick."""
    spec = _spec(body)
    return DEFAULT_POLL_INTERVAL_SECONDS if spec is None else spec.poll_interval_seconds


def target_key(body: Mapping[str, Any]) -> TargetKey | None:
    spec = _spec(body)
    if spec is None:
        return None
    return (body["metadata"]["namespace"], spec.target.group, spec.target.kind, spec.target.name)


def _seniority(body: Mapping[str, Any]) -> tuple[int, str, str]:
    """Which of the pools sharing a target scales it: the oldest (creationTimestamp, RFC 3339 in
    UTC as the API server writes it: its text sorts by time), then by name; a pool without a
    creationTimestamp (a body built by hand) after those with one."""
    meta = body["metadata"]
    created = meta.get("creationTimestamp")
    return (0, created, meta["name"]) if isinstance(created, str) and created else (1, "", meta["name"])


def merge_patch(target: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7386, as the API server applies our status patch."""
    result = dict(target)
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, Mapping):
            result[key] = merge_patch(result.get(key) if isinstance(result.get(key), Mapping) else {}, value)
        else:
            result[key] = value
    return result


def _intent(body: Mapping[str, Any]) -> tuple[Any, Any]:
    """What the user asks of a pool: its spec and its annotations (the pause)."""
    return body.get("spec"), (body.get("metadata") or {}).get("annotations")


@dataclass
class PoolEntry:
    body: dict[str, Any]
    memory: PoolMemory = field(default_factory=PoolMemory)
    next_due: float = 0.0
    task: asyncio.Task | None = None
    #: the spec or a pause annotation changed while a poll was running: poll again when it ends.
    changed: bool = False
    #: the target's replicas after the last poll (PollResult.replicas; None before the first)
    replicas: int | None = None
    #: what its scaleTargetRef names (None: invalid spec), as indexed in PoolScheduler._targets
    target: TargetKey | None = None
    _candidate: tuple[dict[str, Any], int | None, Candidate | None] | None = None

    @property
    def polling(self) -> bool:
        """A poll of this pool runs now."""
        return self.task is not None and not self.task.done()

    def candidate(self) -> Candidate | None:
        """early_notice.candidate for this body and these replicas, worked out again only when
        either changes: the early notice asks for every pool every second."""
        cached = self._candidate
        if cached is None or cached[0] is not self.body or cached[1] != self.replicas:
            try:
                spec = parse_spec_cached(self.body.get("spec") or {})
            except InvalidSpec:
                spec = None
            metadata = self.body["metadata"]
            cached = self._candidate = (self.body, self.replicas, candidate(
                spec, metadata.get("annotations"), namespace=metadata["namespace"], replicas=self.replicas))
        return cached[2]


class PoolScheduler:
    def __init__(self, *, deps: Deps, is_leading: Callable[[], bool] = lambda: True,
                 concurrency: int = DEFAULT_CONCURRENCY, tick: float = TICK_SECONDS,
                 monotonic: Callable[[], float] = time.monotonic,
                 ready_counts: ReadyCountsFn | None = None) -> None:
        self.deps = deps
        #: the early notice's count (early_notice.py); None: pools wait for their polls
        self.ready_counts = ready_counts
        self._probe: asyncio.Task | None = None
        self._probed_at = -math.inf
        self.is_leading = is_leading
        self.tick = tick
        self._monotonic = monotonic
        self._slots = asyncio.Semaphore(concurrency)
        self.pools: dict[Key, PoolEntry] = {}
        #: the pools by what their scaleTargetRef names: more than one is a conflict
        self._targets: dict[TargetKey, set[Key]] = {}
        #: the pool that scales each target shared by pools (PoolScheduler._winner)
        self._winners: dict[TargetKey, Key] = {}
        self._was_leading = False

    def upsert(self, body: Mapping[str, Any]) -> None:
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        entry = self.pools.get(key)
        body = copy.deepcopy(dict(body))
        if entry is None:
            entry = self.pools[key] = PoolEntry(body, next_due=self._monotonic())  # first poll right away
            self._retarget(key, entry)
            return
        before = _intent(entry.body)
        entry.body = body
        if _intent(body) != before:  # a changed spec or pause annotation applies now
            entry.next_due = min(entry.next_due, self._monotonic())
            entry.changed = entry.polling
            self._retarget(key, entry)

    def remove(self, namespace: str, name: str) -> None:
        entry = self.pools.get((namespace, name))
        if entry is not None:
            self._index((namespace, name), entry.target, None)  # while its body is known: it may be the oldest
            del self.pools[(namespace, name)]
        if entry and entry.polling:
            entry.task.cancel()

    def _retarget(self, key: Key, entry: PoolEntry) -> None:
        target = target_key(entry.body)
        if target != entry.target:
            self._index(key, entry.target, target)
            entry.target = target

    def _index(self, key: Key, before: TargetKey | None, after: TargetKey | None) -> None:
        """Move `key` from one target's pools to another's. A pool whose part changes (it scaled
        the target and now must not, or the other way round) is polled now."""
        touched = [target for target in (before, after) if target is not None]
        winners = [self._winner(target) for target in touched]
        if before is not None and before in self._targets:
            self._targets[before].discard(key)
            if self._winners.get(before) == key:
                del self._winners[before]
            if not self._targets[before]:
                del self._targets[before]
        if after is not None:
            self._targets.setdefault(after, set()).add(key)
            if after in self._winners:  # the oldest stays known: one comparison, not a scan
                self._winners[after] = min(self._winners[after], key, key=lambda k: _seniority(self.pools[k].body))
        now = self._monotonic()
        for pool in {*winners, *(self._winner(target) for target in touched)} - {key, None}:
            self.pools[pool].next_due = min(self.pools[pool].next_due, now)

    def _winner(self, target: TargetKey) -> Key | None:
        """The pool that scales `target`: the oldest of those naming it (kept until it leaves)."""
        sharing = self._targets.get(target)
        if not sharing:
            return None
        winner = self._winners.get(target)
        if winner is None:
            winner = self._winners[target] = min(sharing, key=lambda k: _seniority(self.pools[k].body))
        return winner

    def conflict(self, entry: PoolEntry) -> Problem | None:
        """Why this pool must not scale its target (an older pool scales it), or None."""
        sharing = self._targets.get(entry.target) if entry.target is not None else None
        if not sharing or len(sharing) < 2:
            return None
        meta = entry.body["metadata"]
        winner = self._winner(entry.target)
        if winner == (meta["namespace"], meta["name"]):
            return None
        namespace, _, kind, name = entry.target
        more = len(sharing) - 2
        return Problem("ScaleTargetConflict",
                       f"spec.scaleTargetRef.name {name!r} ({kind} {namespace}/{name}) is also the target of "
                       f"WorkerPool {namespace}/{winner[1]}" + (f" (and {more} more)" if more else "")
                       + ", which scales it (the oldest pool does): two pools scaling one target fight over its "
                       "replicas, so this one does not scale it until it names another target or that pool "
                       "is deleted")

    async def _poll(self, entry: PoolEntry, round_started: float) -> PollResult | None:
        async with self._slots:
            try:
                result = await poll_once(entry.body, entry.memory, self.deps, conflict=self.conflict(entry))
            except Exception:  # noqa: BLE001 - poll_once handles the expected; this is a bug
                entry.replicas = None
                metadata = entry.body["metadata"]
                self.deps.metrics.errors.labels(metadata.get("namespace"), metadata.get("name"), "internal").inc()
                log.exception("poll of %s/%s failed", entry.body["metadata"].get("namespace"),
                              entry.body["metadata"].get("name"))
                result = None
            else:
                entry.memory = result.memory
                entry.replicas = result.replicas
                if result.status is not None:
                    # Our own status write comes back as a watch event later; use it now.
                    entry.body["status"] = merge_patch(entry.body.get("status") or {}, result.status)
            # Due again one interval after the round started: pools of equal interval stay in one round.
            entry.next_due = self._monotonic() if entry.changed else round_started + poll_interval(entry.body)
            entry.changed = False
            return result

    async def _round(self, polls: list[asyncio.Task]) -> None:
        results = await asyncio.gather(*polls)
        done = [r for r in results if r is not None]
        log.info("poll completed: pools=%d scaled=%d paged=%d errors=%d", len(results),
                 sum(r.scaled for r in done), sum(r.paged for r in done),
                 sum(len(r.errors) for r in done) + len(results) - len(done))

    def start_due(self) -> list[asyncio.Task]:
        """Start every poll that is due and not already running, as one round; returns the round."""
        leading = self.is_leading()
        self.deps.metrics.leader.set(1 if leading else 0)
        if leading and not self._was_leading:
            for entry in self.pools.values():  # what we saw before losing the lease is stale
                entry.memory = PoolMemory()
                entry.next_due = self._monotonic()
        self._was_leading = leading
        if not leading:
            return []
        now = self._monotonic()
        polls = []
        for entry in self.pools.values():
            if entry.next_due <= now and not entry.polling:
                entry.task = asyncio.create_task(self._poll(entry, now))
                polls.append(entry.task)
        return [asyncio.create_task(self._round(polls))] if polls else []

    def start_probe(self) -> asyncio.Task | None:
        """Start the early notice's count if it is time and the last one ended; returns it."""
        now = self._monotonic()
        if (self.ready_counts is None or not self._was_leading or now - self._probed_at < PROBE_SECONDS
                or (self._probe is not None and not self._probe.done())):
            return None
        self._probed_at = now
        self._probe = asyncio.create_task(self._bring_forward(now))
        return self._probe

    async def _bring_forward(self, now: float) -> None:
        """Count the candidates' ready messages; a pool they outgrow is polled on the next tick."""
        chosen = []
        for entry in self.pools.values():
            # a poll that runs or is due within a count reads the queues itself
            # (a pool that another pool's target conflict stops does not scale: nothing to bring forward)
            if not entry.polling and entry.next_due - now > PROBE_SECONDS and self.conflict(entry) is None:
                found = entry.candidate()
                if found is not None:
                    chosen.append((entry, found, entry.next_due))
        if not chosen:
            return
        try:
            counts = await self.ready_counts([(found.namespace, found.broker) for _, found, _ in chosen])
        except Exception:  # noqa: BLE001 - the regular polls go on and report the broker
            log.debug("early notice: count failed", exc_info=True)
            return
        for (entry, found, due), ready in zip(chosen, counts):
            # a poll that started meanwhile (its next_due moved) read the queues itself; a pool
            # deleted while counting is gone (a series of it now would outlive its deletion)
            name = entry.body["metadata"].get("name")
            if self.pools.get((found.namespace, name)) is not entry:
                continue
            if ready is not None and entry.next_due == due and outgrows(ready, found.replicas, found.policy):
                entry.next_due = self._monotonic()
                self.deps.metrics.early_polls.labels(found.namespace, name).inc()
                log.info("%s/%s: %d ready messages outgrow %d replicas: polled now (early notice)",
                         found.namespace, name, ready, found.replicas)

    async def run(self) -> None:
        while True:
            self.start_due()
            self.start_probe()
            await asyncio.sleep(self.tick)
