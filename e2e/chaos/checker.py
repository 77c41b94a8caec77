"""The checker: what was sent against what happened, per task, Jepsen-style. Pure.

Inputs are the run's own records — what the producer had confirmed (or could not tell), the
effects (PostgreSQL rows under a UNIQUE key plus the duplicate applications the guard should have
stopped, and the Redis-guarded effects list), every attempt, and the dead-letter queue — never the
workers' word. Per task:

- **lost**: its publish was confirmed, it is not poison, it never took effect and is not in the DLQ;
- **duplicated**: it took effect more than once;
- **unexpected**: an effect whose key was never sent, or a poison task that took effect;
- **recovered**: it took effect after at least one of its attempts was interrupted (the attempt
  never finished: its process or pod died, or the attempt was cut off by the fault);
- the **attempts histogram** (attempts -> tasks) of the tasks that took effect;
- **DLQ surprises**: a poison task missing from the DLQ or there for another reason than its kind's,
  and any non-poison task in it.

A publish whose outcome is unknown (the broker or the database failed while it was in flight, and
every retry failed too) is "indeterminate": it may take effect or not, and neither is a violation.
"""
from __future__ import annotations

import collections
import statistics
from dataclasses import asdict, dataclass, field
from typing import Iterable, Mapping

from .spec import POISON_REASONS


@dataclass(frozen=True)
class SentTask:
    key: str
    task_id: str
    kind: str  #: "normal" or a poison kind (spec.POISON_REASONS)
    store: str  #: "postgres" or "redis": which idempotency store guards it
    path: str  #: "direct" or "outbox"
    confirmed: bool  #: False: indeterminate (may or may not have been published)
    at: float = 0.0  #: when the publish was confirmed (or last tried), epoch seconds


@dataclass(frozen=True)
class Attempt:
    key: str
    task_id: str
    pod: str
    started_at: float
    finished_at: float | None  #: None: never finished (its process died)
    outcome: str | None = None


@dataclass(frozen=True)
class DeadLetter:
    key: str
    reason: str
    attempts: int | None = None
    #: who dead-lettered it, when and why, for a surprise's report line ("" when unknown)
    context: str = ""


@dataclass
class Result:
    sent: int
    confirmed: int
    indeterminate: int
    poison_sent: int
    applied: int
    lost: list[str]
    duplicated: dict[str, int]
    unexpected: list[str]
    recovered: list[str]
    attempts_histogram: dict[int, int]
    attempts_p50: float | None
    attempts_max: int | None
    interrupted_attempts: int
    dead_letters: dict[str, int]  #: reason -> envelopes
    dead_letter_keys: list[str]
    dlq_surprises: list[str]
    #: the same task dead-lettered twice (a worker killed between the envelope and the ack: documented,
    #: at-least-once; reported, not a violation)
    dlq_duplicates: list[str]
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def as_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok, "recovered": len(self.recovered),
                "recovered_keys": self.recovered[:50]}


def effect_counts(postgres_effects: Iterable[str], postgres_duplicates: Iterable[str],
                  redis_effects: Iterable[str]) -> dict[str, int]:
    """key -> times its effect was applied: the UNIQUE row, each duplicate application recorded
    instead of a second row, and each entry of the Redis-guarded effects list."""
    counts: collections.Counter[str] = collections.Counter()
    counts.update(postgres_effects)
    counts.update(postgres_duplicates)
    counts.update(redis_effects)
    return dict(counts)


def interrupted(attempt: Attempt) -> bool:
    return attempt.finished_at is None


def check(sent: Iterable[SentTask], effects: Mapping[str, int], attempts: Iterable[Attempt],
          dead_letters: Iterable[DeadLetter]) -> Result:
    sent = _last_word_per_key(sent)
    attempts = list(attempts)
    dead_letters = list(dead_letters)
    normal = {k for k, s in sent.items() if s.kind == "normal"}
    poison = {k: s.kind for k, s in sent.items() if s.kind != "normal"}
    confirmed = {k for k, s in sent.items() if s.confirmed}
    dlq_keys = collections.Counter(d.key for d in dead_letters)
    applied = {k for k, n in effects.items() if n > 0}

    lost = sorted(k for k in normal & confirmed if k not in applied and k not in dlq_keys)
    duplicated = {k: n for k, n in sorted(effects.items()) if n > 1}
    unexpected = sorted(k for k in applied if k not in sent or k in poison)

    by_key: dict[str, list[Attempt]] = collections.defaultdict(list)
    for a in attempts:
        by_key[a.key].append(a)
    recovered = sorted(k for k in normal & applied if any(interrupted(a) for a in by_key.get(k, [])))
    runs = [len(by_key.get(k, [])) for k in sorted(normal & applied)]
    histogram = dict(sorted(collections.Counter(runs).items()))

    surprises = []
    reasons: dict[str, set[str]] = collections.defaultdict(set)
    contexts: dict[str, list[str]] = collections.defaultdict(list)
    for d in dead_letters:
        reasons[d.key].add(d.reason)
        if d.context:
            contexts[d.key].append(d.context)
    for key, kind in sorted(poison.items()):
        want = POISON_REASONS[kind]
        if key not in reasons:
            if sent[key].confirmed:
                surprises.append(f"{key} ({kind}) is not in the DLQ (want reason {want})")
        elif reasons[key] != {want}:
            surprises.append(f"{key} ({kind}) is in the DLQ as {sorted(reasons[key])}, want {want}")
    for key in sorted(set(reasons) - set(poison)):
        context = f" ({'; '.join(contexts[key])})" if contexts[key] else ""
        surprises.append(f"{key} is in the DLQ as {sorted(reasons[key])} but should have succeeded{context}"
                         if key in sent else f"{key} is in the DLQ but was never sent{context}")

    result = Result(
        sent=len(sent), confirmed=len(confirmed), indeterminate=len(sent) - len(confirmed), poison_sent=len(poison),
        applied=len(applied & normal), lost=lost, duplicated=duplicated, unexpected=unexpected, recovered=recovered,
        attempts_histogram=histogram,
        attempts_p50=statistics.median(runs) if runs else None, attempts_max=max(runs) if runs else None,
        interrupted_attempts=sum(1 for a in attempts if interrupted(a)),
        dead_letters=dict(collections.Counter(d.reason for d in dead_letters)), dead_letter_keys=sorted(dlq_keys),
        dlq_surprises=surprises,
        dlq_duplicates=sorted(k for k, n in dlq_keys.items() if n > 1),
    )
    if not sent:
        result.failures.append("nothing was sent: the scenario had no load")
    if lost:
        result.failures.append(f"lost: {len(lost)} task(s) confirmed, never applied, not in the DLQ: {_few(lost)}")
    if duplicated:
        result.failures.append(f"duplicated: {len(duplicated)} task(s) applied more than once: "
                               f"{_few(f'{k}x{n}' for k, n in duplicated.items())}")
    if unexpected:
        result.failures.append(f"unexpected: {len(unexpected)} effect(s) of tasks never sent or poison: "
                               f"{_few(unexpected)}")
    if surprises:
        result.failures.append(f"DLQ surprises: {_few(surprises)}")
    return result


def _last_word_per_key(sent: Iterable[SentTask]) -> dict[str, SentTask]:
    """A key published several times (a retried publish) counts once, confirmed if any try was."""
    out: dict[str, SentTask] = {}
    for s in sent:
        previous = out.get(s.key)
        if previous is None or (s.confirmed and not previous.confirmed):
            out[s.key] = s
    return out


def _few(items: Iterable[str], limit: int = 5) -> str:
    items = list(items)
    return ", ".join(items[:limit]) + (f" … (+{len(items) - limit} more)" if len(items) > limit else "")
