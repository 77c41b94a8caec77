"""Queue inspection on RabbitMQ through the management HTTP API (one GET per queue).

- ready / unacked / consumers: ``messages_ready``, ``messages_unacknowledged``, ``consumers``.
  The management statistics are refreshed every ``collect_statistics_interval`` (5 s by default;
  a new quorum queue reports nothing for its first ~10 s): figures lag by that much.
- Oldest ready age, classic queues: ``head_message_timestamp``, i.e. the AMQP ``timestamp``
  property of the head message (stamped by taskherd.worker.stamping; whole seconds). It is null
  when the head is paged out or unstamped; we then fall back to the publish-counter estimate.
- Oldest ready age, quorum queues: no head timestamp exists; see publish_history.py for the
  estimate and its error.
- Oldest unacked age: the API does not expose delivery times: None.
- A queue that does not exist (a DLQ nothing was ever dead-lettered to) reads as empty.
"""
from __future__ import annotations

import time
from urllib.parse import quote, unquote, urlsplit

import httpx

from .publish_history import DEFAULT_HISTORY, PublishHistory
from .stats import AGE_FROM_HEAD_TIMESTAMP, BrokerUnreachable, QueueStats

DEFAULT_MANAGEMENT_PORT = 15672
#: head_message_timestamp has whole-second resolution.
HEAD_TIMESTAMP_RESOLUTION = 1.0


def management_url_for(amqp_url: str) -> str:
    """``http://user:pass@host:15672`` from the AMQP URL's host and credentials."""
    parts = urlsplit(amqp_url)
    credentials = f"{parts.username or 'guest'}:{parts.password or 'guest'}@"
    return f"http://{credentials}{parts.hostname or 'localhost'}:{DEFAULT_MANAGEMENT_PORT}"


def vhost_of(amqp_url: str) -> str:
    path = urlsplit(amqp_url).path
    return unquote(path[1:]) if len(path) > 1 else "/"


def inspect_rabbitmq(amqp_url: str, queues: list[str], *, management_url: str | None = None,
                     now: float | None = None, history: PublishHistory | None = None,
                     timeout: float = 10.0) -> dict[str, QueueStats]:
    api = urlsplit(management_url or management_url_for(amqp_url))
    base = f"{api.scheme}://{api.hostname}:{api.port or DEFAULT_MANAGEMENT_PORT}{api.path.rstrip('/')}"
    auth = (unquote(api.username or "guest"), unquote(api.password or "guest"))
    vhost = vhost_of(amqp_url)
    history = DEFAULT_HISTORY if history is None else history
    result = {}
    try:
        with httpx.Client(base_url=base, auth=auth, timeout=timeout) as client:
            for queue in queues:
                response = client.get(f"/api/queues/{quote(vhost, safe='')}/{quote(queue, safe='')}")
                if response.status_code == 404:
                    result[queue] = QueueStats(queue=queue, ready=0, unacked=0, consumers=0,
                                               oldest_age_seconds=None, oldest_unacked_age_seconds=None)
                    continue
                response.raise_for_status()
                result[queue] = stats_from_api(response.json(), vhost=vhost, base=base,
                                               now=time.time() if now is None else now, history=history)
    except httpx.HTTPError as exc:
        raise BrokerUnreachable(f"RabbitMQ management API at {base} (vhost {vhost!r}): {exc}") from exc
    return result


def stats_from_api(body: dict, *, vhost: str, base: str, now: float, history: PublishHistory) -> QueueStats:
    """One QueueStats from one /api/queues/<vhost>/<name> document. Pure apart from ``history``."""
    queue = body["name"]
    ready = int(body.get("messages_ready") or 0)
    published_total = int((body.get("message_stats") or {}).get("publish") or 0)
    # Always observed, so that the history spans the time before the head timestamp goes missing.
    estimate = history.observe((base, vhost, queue), now=now, published_total=published_total, ready=ready)
    age = error = method = None
    head_timestamp = body.get("head_message_timestamp")
    if ready and isinstance(head_timestamp, (int, float)) and head_timestamp > 0:
        age, error, method = max(0.0, now - head_timestamp), HEAD_TIMESTAMP_RESOLUTION, AGE_FROM_HEAD_TIMESTAMP
    elif ready and estimate is not None:
        age, error, method = estimate.age_seconds, estimate.error_seconds, estimate.method
    return QueueStats(
        queue=queue,
        ready=ready,
        unacked=int(body.get("messages_unacknowledged") or 0),
        consumers=int(body.get("consumers") or 0),
        oldest_age_seconds=age,
        oldest_unacked_age_seconds=None,
        oldest_age_method=method,
        oldest_age_error_seconds=error,
    )
