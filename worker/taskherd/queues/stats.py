"""What one inspection of one queue says, whatever the broker. No broker client imported here."""
from __future__ import annotations

from dataclasses import dataclass

#: How ``oldest_age_seconds`` was obtained (``QueueStats.oldest_age_method``).
AGE_FROM_STAMP = "publish_stamp"  # Redis: the message's own taskherd_published_at header
AGE_FROM_HEAD_TIMESTAMP = "head_timestamp"  # RabbitMQ classic: head_message_timestamp (1 s resolution)
AGE_FROM_PUBLISH_COUNTER = "publish_counter"  # RabbitMQ without a head timestamp: the broker's counter history
AGE_LOWER_BOUND = "publish_counter_lower_bound"  # the head predates that history: "at least" this old


class InspectionError(Exception):
    """Any failure to inspect queues (the classes below); a reply the inspection could not read,
    whatever raised it, is wrapped in one of them with the broker's own error and its URL redacted."""


class BrokerUnreachable(InspectionError):
    """The broker (or its management API) could not be reached, or refused the client as a whole
    (authentication, a management API 401/403): the next URL of a failover list may answer."""


class BrokerRefused(InspectionError):
    """The broker answered, with an error (a key of the wrong type, an ACL refusal, a management
    API 5xx, a malformed reply): it is the broker the workers are connected to, so a failover list
    is not tried further (taskherd.queues.first_answer). ``answered_index`` is the index in the
    failover list of the URL that answered (set by first_answer; 0 for a single URL)."""

    answered_index: int = 0


class QueuesUnreadable(BrokerRefused):
    """The broker answered, but some queues could not be read. ``errors``: queue -> why (the
    broker's own error); ``stats``: the figures of the queues that were read, which stay valid
    (the figures of one queue never depend on another)."""

    def __init__(self, errors: dict[str, str], stats: dict[str, "QueueStats"], *, where: str = "") -> None:
        self.errors, self.stats, self.where = dict(errors), dict(stats), where
        prefix = f"{where}: " if where else ""
        super().__init__(prefix + "; ".join(f"queue {queue!r}: {why}" for queue, why in self.errors.items()))


@dataclass(frozen=True)
class QueueStats:
    queue: str
    ready: int  # messages waiting to be delivered (all priority sub-lists on Redis)
    unacked: int  # delivered to a worker but not yet acknowledged (reserved + running)
    consumers: int | None  # None where the broker cannot tell (Redis)
    #: age of the oldest READY message; None if empty or unknown. Read it with oldest_age_method:
    #: for AGE_LOWER_BOUND the message has waited AT LEAST this long.
    oldest_age_seconds: float | None
    oldest_unacked_age_seconds: float | None  # age of the oldest unacknowledged delivery; None if none/unknown
    #: Redis only: the transport's visibility_timeout the unacked age is measured against.
    visibility_timeout_seconds: float | None = None
    #: One of the AGE_* constants above; None when there is no age.
    oldest_age_method: str | None = None
    #: For estimates: the true age lies within ``oldest_age_seconds`` ± this. For the lower-bound
    #: method it is None (the true age is at least the figure). 0 for exact stamps.
    oldest_age_error_seconds: float | None = None
    #: RabbitMQ: the broker has not reported this queue's figures yet (a new queue, a node that
    #: just started); ready/unacked read 0 but mean "unknown".
    pending: bool = False

    @property
    def oldest_age_is_lower_bound(self) -> bool:
        """True when messages wait but their age is only known from below (or not at all: 0)."""
        return self.ready > 0 and (self.oldest_age_seconds is None or self.oldest_age_method == AGE_LOWER_BOUND)

    @property
    def depth(self) -> int:
        return self.ready + self.unacked

    @property
    def visibility_timeout_remaining_seconds(self) -> float | None:
        """Seconds before kombu would redeliver the oldest unacked message (negative: overdue)."""
        if self.visibility_timeout_seconds is None or self.oldest_unacked_age_seconds is None:
            return None
        return self.visibility_timeout_seconds - self.oldest_unacked_age_seconds
