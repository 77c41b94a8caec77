"""What one inspection of one queue says, whatever the broker. No broker client imported here."""
from __future__ import annotations

from dataclasses import dataclass

#: How ``oldest_age_seconds`` was obtained (``QueueStats.oldest_age_method``).
AGE_FROM_STAMP = "publish_stamp"  # Redis: the message's own taskherd_published_at header
AGE_FROM_HEAD_TIMESTAMP = "head_timestamp"  # RabbitMQ classic: head_message_timestamp (1 s resolution)
AGE_FROM_PUBLISH_COUNTER = "publish_counter"  # RabbitMQ without a head timestamp: the broker's counter history
AGE_LOWER_BOUND = "publish_counter_lower_bound"  # the head predates that history: "at least" this old


class BrokerUnreachable(Exception):
    """The broker (or its management API) could not be reached or answered with an error."""


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
