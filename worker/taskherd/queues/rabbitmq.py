"""Queue inspection on RabbitMQ through the management HTTP API (one or two GETs per queue; for a
caller that keeps a VhostListing, one listing of the vhost a second instead, see there).

- ready / unacked / consumers: ``messages_ready``, ``messages_unacknowledged``, ``consumers``.
  The management statistics are refreshed every ``collect_statistics_interval`` (5 s by default):
  figures lag by that much. A new queue (or any queue on a freshly started node) has no counts
  for its first seconds: its ``QueueStats.pending`` is True, its zeros mean "not reported yet".
- Oldest ready age, when the head carries a timestamp: ``head_message_timestamp``, i.e. the AMQP
  ``timestamp`` property of the head message (stamped by taskherd.worker.stamping; whole seconds).
  Classic queues only, and absent while the head is paged out, unstamped, or not in the
  statistics yet.
- Otherwise: the broker's own history of the publish counter (publish_history.py), which brackets
  when the head was published, or says "at least" when the head is older than the history.
  Nothing is consumed or requeued to find out.
- Oldest unacked age: the API does not expose delivery times: None.
- A queue that does not exist (a DLQ nothing was ever dead-lettered to) reads as empty.
- Errors: no answer, or a 401/403, is BrokerUnreachable (the next node of a failover list shows
  the same queues); another error answering for one queue (a 5xx, a reply that is not the JSON
  document expected) is that queue's, raised as QueuesUnreadable with the other queues' figures.
"""
from __future__ import annotations

import threading
import time
from typing import Callable
from urllib.parse import quote, unquote, urlsplit

import httpx

from .publish_history import head_age, samples_of
from .stats import (AGE_FROM_HEAD_TIMESTAMP, AGE_LOWER_BOUND, BrokerRefused, BrokerUnreachable, QueueStats,
                    QueuesUnreadable)

#: management API answers that refuse the client whatever the queue (credentials, the user's
#: permissions on the vhost): the whole inspection fails at once, and a failover list's next node,
#: which shows the same queues, may answer
REFUSING_STATUSES = (401, 403)

DEFAULT_MANAGEMENT_PORT = 15672
#: head_message_timestamp has whole-second resolution.
HEAD_TIMESTAMP_RESOLUTION = 1.0
#: Windows of the publish counter's history, as (seconds, sample spacing): the default retention
#: keeps 5 s samples for 10 minutes and 60 s samples for an hour. The second is asked for only when
#: the head is older than the first; the API refuses more than a few hundred samples per request.
COUNTER_WINDOWS = ((600, 5), (3600, 60))
#: Only what the inspection reads (the full document lists every consumer and more).
COLUMNS = ("name,type,messages_ready,messages_unacknowledged,consumers,head_message_timestamp,"
           "message_stats.publish,message_stats.publish_details")
#: What a listing of a whole vhost reads (VhostListing): all but the publish history.
LIST_COLUMNS = "name,type,messages_ready,messages_unacknowledged,consumers,head_message_timestamp"


def management_url_for(amqp_url: str) -> str:
    """``http://user:pass@host:15672`` from the AMQP URL's host and credentials."""
    parts = urlsplit(amqp_url)
    credentials = f"{parts.username or 'guest'}:{parts.password or 'guest'}@"
    return f"http://{credentials}{parts.hostname or 'localhost'}:{DEFAULT_MANAGEMENT_PORT}"


def vhost_of(amqp_url: str) -> str:
    path = urlsplit(amqp_url).path
    return unquote(path[1:]) if len(path) > 1 else "/"


#: HTTP clients kept between inspections, one per management API (and credentials): making one
#: loads the TLS trust store, about 50 ms of CPU, which a poll every few seconds per pool would pay
#: each time (bench/inspection_cost.py). httpx clients are thread-safe.
_clients: dict[tuple, httpx.Client] = {}
_clients_lock = threading.Lock()
#: a rotated password leaves its old client behind: keep at most this many
MAX_CLIENTS = 32


def _client(base: str, auth: tuple[str, str], timeout: float) -> httpx.Client:
    key = (base, auth, timeout)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            if len(_clients) >= MAX_CLIENTS:
                _clients.pop(next(iter(_clients))).close()
            client = _clients[key] = httpx.Client(base_url=base, auth=auth, timeout=timeout)
        return client


class VhostListing:
    """Every queue of one vhost from one GET, for a caller that inspects many of its queues every
    few seconds (the operator: an inspection per pool and poll, a GET per queue otherwise — 1.8 ms
    of CPU a pool, a third of a core at 1,000 pools; bench/operator_scale.py): at most one listing
    per `max_age_seconds`, shared by every inspection of that vhost. The management statistics
    themselves refresh every 5 s (collect_statistics_interval), so a listing up to a second old
    adds little to their lag. A queue the listing does not have yet reads as missing (empty)."""

    def __init__(self, *, max_age_seconds: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_age_seconds = max_age_seconds
        self._clock = clock
        self._lock = threading.Lock()  # inspections run in worker threads
        self._read_at: float | None = None
        self._listed: tuple[str, str] | None = None  # (management API, vhost) of the documents
        self._documents: dict[str, dict] = {}

    def documents(self, client: httpx.Client, vhost: str) -> dict[str, dict]:
        """Queue name -> its document (LIST_COLUMNS), from a listing at most max_age_seconds old."""
        with self._lock:
            now, listed = self._clock(), (str(client.base_url), vhost)
            if self._read_at is None or now - self._read_at >= self.max_age_seconds or listed != self._listed:
                response = client.get(f"/api/queues/{quote(vhost, safe='')}", params={"columns": LIST_COLUMNS})
                response.raise_for_status()
                self._documents = {body["name"]: body for body in response.json()}
                self._read_at, self._listed = now, listed
            return self._documents


def inspect_rabbitmq(amqp_url: str, queues: list[str], *, management_url: str | None = None,
                     now: float | None = None, timeout: float = 10.0,
                     listing: VhostListing | None = None) -> dict[str, QueueStats]:
    """`listing` (kept by a caller that inspects often) answers from one listing of the vhost; a
    queue whose head age needs its publish history (the head unstamped, or not reported) is still
    asked for its own document."""
    api = urlsplit(management_url or management_url_for(amqp_url))
    base = f"{api.scheme}://{api.hostname}:{api.port or DEFAULT_MANAGEMENT_PORT}{api.path.rstrip('/')}"
    auth = (unquote(api.username or "guest"), unquote(api.password or "guest"))
    vhost = vhost_of(amqp_url)
    where = f"RabbitMQ management API at {base} (vhost {vhost!r})"
    result: dict[str, QueueStats] = {}
    errors: dict[str, str] = {}
    now = time.time() if now is None else now
    client = _client(base, auth, timeout)
    documents = None
    if listing is not None:
        try:
            documents = listing.documents(client, vhost)
        except Exception as exc:  # noqa: BLE001 - the listing is every queue's: every pool of an
            # operator's batch meets it (inspection_batch.py), and the next node may answer it
            raise BrokerUnreachable(f"{where}: listing the vhost's queues: {_said(exc)}") from exc
    for queue in queues:
        try:
            if documents is not None:
                body = documents.get(queue)
                listed = _missing(queue) if body is None else stats_from_api(body, now=now)
                if not (listed.ready and listed.oldest_age_seconds is None):
                    result[queue] = listed
                    continue
            path = f"/api/queues/{quote(vhost, safe='')}/{quote(queue, safe='')}"
            for age, spacing in COUNTER_WINDOWS:
                response = client.get(path, params={"columns": COLUMNS, "msg_rates_age": age,
                                                    "msg_rates_incr": spacing})
                if response.status_code == 404:
                    result[queue] = _missing(queue)
                    break
                response.raise_for_status()
                result[queue] = stats_from_api(response.json(), now=now)
                if result[queue].oldest_age_method != AGE_LOWER_BOUND:
                    break  # older than this window: look further back
        except Exception as exc:  # noqa: BLE001 - one queue's answer, unless it refuses us whole
            failed = _whole(where, exc)
            if isinstance(failed, BrokerUnreachable):
                raise failed from exc
            result.pop(queue, None)
            errors[queue] = _said(exc)
    if errors:
        raise QueuesUnreadable(errors, result, where=where)
    return result


def _said(exc: BaseException) -> str:
    """The management API's own error: its status and the start of its body, or what could not
    be read in its reply."""
    if isinstance(exc, httpx.HTTPStatusError):
        body = " ".join(exc.response.text.split())[:200]
        return f"HTTP {exc.response.status_code} {exc.response.reason_phrase}" + (f": {body}" if body else "")
    if isinstance(exc, ValueError):  # json.JSONDecodeError included
        return f"a reply that is not the JSON expected ({type(exc).__name__}: {exc})"
    if isinstance(exc, (KeyError, TypeError, AttributeError)):
        return f"a JSON reply not shaped as a queue's document ({type(exc).__name__}: {exc})"
    return f"{type(exc).__name__}: {exc}"


def _whole(where: str, exc: BaseException) -> Exception:
    """The error of an answer that concerns every queue: unreachable, or refused."""
    if isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code not in REFUSING_STATUSES:
        return BrokerRefused(f"{where}: {_said(exc)}")
    if isinstance(exc, httpx.HTTPError):  # no answer (connect, read, timeout), or a 401/403
        return BrokerUnreachable(f"{where}: {_said(exc)}")
    return BrokerRefused(f"{where}: {_said(exc)}")


def _missing(queue: str) -> QueueStats:
    """A queue that does not exist (a DLQ nothing was ever dead-lettered to) reads as empty."""
    return QueueStats(queue=queue, ready=0, unacked=0, consumers=0, oldest_age_seconds=None,
                      oldest_unacked_age_seconds=None)


def stats_from_api(body: dict, *, now: float) -> QueueStats:
    """One QueueStats from one /api/queues/<vhost>/<name> document (pure)."""
    queue = body["name"]
    if "messages_ready" not in body:  # the queue's statistics have not been emitted yet
        return QueueStats(queue=queue, ready=0, unacked=0, consumers=int(body.get("consumers") or 0),
                          oldest_age_seconds=None, oldest_unacked_age_seconds=None, pending=True)
    ready = int(body.get("messages_ready") or 0)
    age = error = method = None
    head_timestamp = body.get("head_message_timestamp")
    stats = body.get("message_stats") or {}
    if ready and isinstance(head_timestamp, (int, float)) and head_timestamp > 0:
        age, error, method = max(0.0, now - head_timestamp), HEAD_TIMESTAMP_RESOLUTION, AGE_FROM_HEAD_TIMESTAMP
    elif ready and "publish" in stats:
        estimate = head_age(samples_of(stats.get("publish_details")), published_total=int(stats["publish"]),
                            ready=ready, now=now)
        if estimate is not None:
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
