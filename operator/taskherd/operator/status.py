"""A WorkerPool's status conditions (pure): set, compare, and what changed since the last poll.

They follow the Kubernetes API conventions (metav1.Condition): a list keyed by `type`, each with
status True/False, a CamelCase `reason`, a `message`, `lastTransitionTime` (kept while the status
does not change) and the `observedGeneration` of the spec it describes.
"""
from __future__ import annotations

from typing import Any, Mapping

from taskherd.contract import redact

from .alerts import rfc3339

#: Kubernetes caps a condition message at 32768 characters; ours stay readable in `describe`.
MESSAGE_LIMIT = 1000


class Conditions:
    """Status conditions that keep lastTransitionTime when the status did not change."""

    def __init__(self, previous: list[Mapping[str, Any]] | None, now: float, generation: int | None = None) -> None:
        self._previous = {c["type"]: dict(c) for c in previous or [] if "type" in c}
        self._items = dict(self._previous)
        self._now_seconds = now
        self._now_text: str | None = None  # formatted only when a condition changes: most polls change none
        self._generation = generation
        #: what changed in this poll, for the log.
        self.transitions: list[str] = []

    def set(self, type_: str, ok: bool, reason: str, message: str) -> None:
        status, message = "True" if ok else "False", redact(message)
        old = self._items.get(type_, {})
        if old.get("status") != status or old.get("reason") != reason:
            self.transitions.append(f"{type_}={status} ({reason}: {message[:200]})")
        since = old.get("lastTransitionTime") if old.get("status") == status else None
        self._items[type_] = {"type": type_, "status": status, "reason": reason,
                              "message": message[:MESSAGE_LIMIT] or reason, "lastTransitionTime": since or self._now()}
        if self._generation is not None:
            self._items[type_]["observedGeneration"] = self._generation

    def _now(self) -> str:
        if self._now_text is None:
            self._now_text = rfc3339(self._now_seconds)
        return self._now_text

    def get(self, type_: str) -> Mapping[str, Any]:
        return self._items.get(type_, {})

    def is_true(self, type_: str) -> bool:
        return self.get(type_).get("status") == "True"

    def newly(self, type_: str, status: str) -> bool:
        """`status` now, and not with the same reason before this poll: worth one Event."""
        old, new = self._previous.get(type_, {}), self.get(type_)
        return new.get("status") == status and (old.get("status"), old.get("reason")) != (status, new.get("reason"))

    def as_list(self) -> list[dict[str, Any]]:
        return [self._items[k] for k in sorted(self._items)]
