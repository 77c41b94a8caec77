"""Observing a pool's queues: the broker URL from its Secret, then `taskherd.queues.inspect_queues`.

`inspect_queues` is blocking (redis-py / HTTP to the RabbitMQ management API), so it runs in a
worker thread. The pools of one broker polled at the same time share one inspection
(inspection_batch.py): on Redis one pipeline, on RabbitMQ one listing of the vhost. A ';'-joined
failover list is observed at the URL that answers, as kombu connects (BrokerObserver._answered). The observer is injectable: the observe step of a poll takes any
`async (namespace, BrokerSpec) -> Observation` and tests pass a fake.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Mapping, Sequence
from urllib.parse import urlsplit

from taskherd import contract
from taskherd.queues import FailoverMemory

from .early_notice import PROBE_SECONDS
from .inspection_batch import BrokerAddress, InspectionBatcher
from .kube import Kube, NotFound
from .policy import BrokerSpec
from .scaling import Observation

if TYPE_CHECKING:
    from taskherd.queues import QueueStats

log = logging.getLogger("taskherd.operator")

ObserveFn = Callable[[str, BrokerSpec], Awaitable[Observation]]
#: a Secret is re-read at most this often (a rotated URL is picked up within this delay).
SECRET_TTL_SECONDS = 30.0
#: Redis clients (one connection pool per broker URL), unacked readers, RabbitMQ listings and
#: ready counters kept, each kind: a rotated URL leaves its old one behind.
MAX_KEPT = 64
#: how old a poll's figures of a Redis broker's unacknowledged deliveries may be (the ready
#: messages are always read fresh): one read of them a second serves every poll of that broker.
UNACKED_MAX_AGE_SECONDS = 1.0
#: how old the listing of a RabbitMQ vhost a poll reads may be (the management API's own figures
#: refresh every 5 s): one listing a second serves every pool of that vhost.
LISTING_MAX_AGE_SECONDS = 1.0
#: an early-notice count of a RabbitMQ queue (every PROBE_SECONDS) this recent gives the poll its
#: ready messages, fresher than the management API's: the poll a count brought forward runs at the
#: scheduler's next tick
COUNT_MAX_AGE_SECONDS = 2 * PROBE_SECONDS
#: the broker URLs the operator can observe: Redis through redis-py (whose client is kept between
#: polls), RabbitMQ through its management API, its queues counted early over py-amqp
#: (taskherd.queues.rabbitmq_counts). A Secret holding another (kombu's sentinel://, redis+socket://,
#: librabbitmq://) is SecretValueInvalid: every poll would fail on it.
OBSERVED_SCHEMES = contract.REDIS_PY_SCHEMES + contract.PY_AMQP_SCHEMES


class ObservationError(RuntimeError):
    """The queues could not be observed; `reason` and the message become the BrokerReachable
    condition (and a Warning Event when it turns False)."""

    def __init__(self, message: str, *, reason: str = "BrokerUnreachable") -> None:
        super().__init__(message)
        self.reason = reason


def secret_values_problem(broker: BrokerSpec, url: str, management_url: str | None) -> str | None:
    """Why the Secret's values cannot be the pool's broker (None when they can), said before
    anything connects: a URL that is no broker's, of the other broker than spec.broker.type, or a
    management API URL a client could not append its paths to (each shown without its password)."""
    key = broker.secret_key
    try:
        contract.broker_url(url)
    except ValueError as exc:
        return (f"key {key!r} = {contract.redact(url)!r} is not a broker URL"
                + contract.said_with_valid(str(exc), BROKER_URL_VALID))
    kind = "rabbitmq" if contract.broker_kind(url) == "amqp" else "redis"
    if kind != broker.type:
        return (f"key {key!r} holds a {kind} URL but spec.broker.type is {broker.type!r} "
                f"(valid: a {broker.type} URL, or spec.broker.type: {kind})")
    unobserved = [one for one in contract.failover_urls(url) if _scheme(one) not in OBSERVED_SCHEMES]
    if unobserved:
        return (f"key {key!r} = {contract.redact(unobserved[0])!r}: the operator cannot observe a "
                f"{_scheme(unobserved[0])}:// broker, it reads Redis with redis-py and RabbitMQ through its "
                f"management API (valid: {', '.join(s + '://' for s in OBSERVED_SCHEMES)})")
    if management_url is not None:
        problem = contract.http_url_problem(management_url, base=True)
        if problem:
            return (f"key {broker.management_url_key!r} = {contract.redact(management_url)!r} is not the "
                    f"management API's URL{contract.said_with_valid(problem, contract.HTTP_BASE_URL_VALID)}")
    return None


BROKER_URL_VALID = "a redis://, rediss:// or amqp:// URL (';'-joined for failover)"


def _scheme(url: str) -> str:
    return urlsplit(url).scheme.lower()


def aggregate(stats: Mapping[str, QueueStats], broker: BrokerSpec) -> Observation:
    """Sum the pool's work queues; DLQs are reported per queue (their ready count).

    The pool's oldest message is the oldest of its queues: exact only when every queue with
    waiting messages knows its age exactly, otherwise "at least" the largest figure known."""
    work = [stats[q] for q in broker.queues if q in stats]
    waiting = [s for s in work if s.ready > 0]
    known = [s for s in waiting if s.oldest_age_seconds is not None]
    oldest = max(known, key=lambda s: s.oldest_age_seconds, default=None)
    return Observation(
        ready=sum(s.ready for s in work),
        unacked=sum(s.unacked for s in work),
        oldest_message_age_seconds=oldest.oldest_age_seconds if oldest else (0.0 if waiting else None),
        oldest_message_age_is_lower_bound=any(s.oldest_age_is_lower_bound for s in waiting),
        oldest_message_age_method=oldest.oldest_age_method if oldest else None,
        dead_letters={q: None if stats[q].pending else stats[q].ready for q in broker.dead_letter_queues if q in stats},
        pending_queues=tuple(q for q in broker.queues if q in stats and stats[q].pending),
    )


class BrokerObserver:
    def __init__(self, *, kube: Kube, inspect: Callable[..., Mapping[str, Any]] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.kube = kube
        self._inspect = inspect
        self._clock = clock
        self._secrets: dict[tuple[str, str], tuple[float, dict[str, str]]] = {}
        #: each pool's broker address (or why none) with the read of the Secret it was judged from
        self._judged: dict[tuple, tuple[dict[str, str], BrokerAddress | tuple[str, str]]] = {}
        self._forgotten_at = clock()  # the last _forget_unused_secrets
        self._redis_clients: dict[str, Any] = {}
        self._unacked_readers: dict[tuple[str, str], Any] = {}
        self._listings: dict[tuple[str, str | None], Any] = {}
        self._counters: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._batches = InspectionBatcher(self._inspect_in_thread)
        #: of each failover list, the URL that answered last (the exporter keeps the same memory)
        self._failover = FailoverMemory(max_kept=MAX_KEPT)

    def _inspect_default(self, url: str, queues: list[str], *, management_url: str | None,
                         global_keyprefix: str) -> Mapping[str, Any]:
        """`taskherd.queues.inspect_queues`, except that Redis clients are kept between polls (a
        new connection per poll cost 2 ms of the 3 ms CPU of a poll), and so are the broker's
        unacknowledged deliveries, read at most once a second and only what changed (with 6,000
        tasks running, reading them whole cost ~105 ms a batch: bench/operator_scale.py); on
        RabbitMQ a listing of the vhost, at most once a second, answers the pools' queues, with
        the ready messages the early notice counted in the last COUNT_MAX_AGE_SECONDS."""
        if _scheme(url) in contract.REDIS_PY_SCHEMES:
            from taskherd.queues.redis import inspect_redis
            return inspect_redis(url, queues, global_keyprefix=global_keyprefix, client=self._redis_client(url),
                                 unacked=self._unacked(url, global_keyprefix))
        from taskherd.queues.rabbitmq import inspect_rabbitmq  # the Secret's check let only OBSERVED_SCHEMES by
        from taskherd.queues.rabbitmq_counts import with_counted_ready
        stats = inspect_rabbitmq(url, queues, management_url=management_url,
                                 listing=self._listing(url, management_url))
        counter = self._counters.get(url)  # the early notice's, when it counts this broker
        return stats if counter is None else with_counted_ready(stats, counter.recent(queues, COUNT_MAX_AGE_SECONDS))

    def _redis_client(self, url: str) -> Any:
        import redis
        return self._kept(self._redis_clients, url,
                          lambda: redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5),
                          evicted=lambda client: client.close())

    def _listing(self, url: str, management_url: str | None) -> Any:
        from taskherd.queues.rabbitmq import VhostListing
        return self._kept(self._listings, (url, management_url),
                          lambda: VhostListing(max_age_seconds=LISTING_MAX_AGE_SECONDS, clock=self._clock))

    def _counter(self, url: str) -> Any:
        from taskherd.queues.rabbitmq_counts import ReadyCounter
        return self._kept(self._counters, url, lambda: ReadyCounter(url, clock=self._clock),
                          evicted=lambda counter: counter.close())

    def _unacked(self, url: str, global_keyprefix: str) -> Any:
        from taskherd.queues.redis_unacked import UnackedDeliveries
        return self._kept(self._unacked_readers, (url, global_keyprefix),
                          lambda: UnackedDeliveries(max_age_seconds=UNACKED_MAX_AGE_SECONDS, clock=self._clock))

    def _kept(self, kept: dict, key: Any, make: Callable[[], Any],
              evicted: Callable[[Any], Any] | None = None) -> Any:
        """kept[key], made on first use; at most MAX_KEPT of them, the oldest made first to go."""
        with self._lock:
            value = kept.get(key)
            if value is None:
                if len(kept) >= MAX_KEPT:
                    oldest = kept.pop(next(iter(kept)))
                    if evicted is not None:
                        evicted(oldest)
                value = kept[key] = make()
            return value

    async def _secret(self, namespace: str, name: str) -> dict[str, str]:
        cached = self._secrets.get((namespace, name))
        if cached and self._clock() - cached[0] < SECRET_TTL_SECONDS:
            return cached[1]
        try:
            data = await self.kube.read_secret(namespace, name)
        except NotFound as exc:
            raise ObservationError(f"broker Secret {namespace}/{name} not found", reason="SecretNotFound") from exc
        except Exception as exc:  # noqa: BLE001 - 403, 5xx, timeouts: the Secret, not the broker
            raise ObservationError(f"broker Secret {namespace}/{name} not read: {type(exc).__name__}: {exc}",
                                   reason="SecretNotRead") from exc
        now = self._clock()
        self._secrets[(namespace, name)] = (now, data)
        if now - self._forgotten_at >= SECRET_TTL_SECONDS:
            self._forget_unused_secrets(now)
        return data

    def _forget_unused_secrets(self, now: float) -> None:
        """Drops the Secrets no poll has read for two TTLs (their pools were deleted or moved to
        another Secret: a live pool reads its Secret again every TTL) and the verdicts judged from
        Secrets no longer kept. At most once a TTL: a sweep visits every entry."""
        self._forgotten_at = now
        for key in [key for key, (read_at, _) in self._secrets.items() if now - read_at > 2 * SECRET_TTL_SECONDS]:
            del self._secrets[key]
        kept = {id(data) for _, data in self._secrets.values()}
        for key in [key for key, (secret, _) in self._judged.items() if id(secret) not in kept]:
            del self._judged[key]

    async def _address(self, namespace: str, broker: BrokerSpec) -> BrokerAddress:
        secret = await self._secret(namespace, broker.secret_name)
        key = (namespace, broker.secret_name, broker.secret_key, broker.management_url_key, broker.type,
               broker.global_keyprefix)
        judged = self._judged.get(key)
        if judged is None or judged[0] is not secret:  # judged once per read of the Secret, not every poll
            judged = self._judged[key] = (secret, _judge(namespace, broker, secret))
        verdict = judged[1]
        if isinstance(verdict, BrokerAddress):
            return verdict
        message, reason = verdict  # a new error each time: one raised again keeps every traceback before
        raise ObservationError(message, reason=reason)

    async def ready_counts(self, pools: Sequence[tuple[str, BrokerSpec]]) -> list[int | None]:
        """The ready messages of each pool's work queues (namespace, broker), for the early notice
        (early_notice.py), counted now: one command per Redis broker for all of its pools, with
        the clients the polls keep; on RabbitMQ one pipelined round of passive declares per broker
        (the management API's figures are up to 5 s old: rabbitmq_counts.py). None for a pool
        whose broker did not answer, or none of whose queues exists: its regular poll reports why."""
        # most pools share a few Secrets: each is looked up once (a task each cost more than the count)
        by_secret: dict[tuple[str, str, str, str], list[int]] = {}
        for index, (ns, broker) in enumerate(pools):
            by_secret.setdefault((ns, broker.secret_name, broker.secret_key, broker.global_keyprefix), []).append(index)
        found = await asyncio.gather(*(self._address(*pools[indexes[0]]) for indexes in by_secret.values()),
                                     return_exceptions=True)
        by_address: dict[BrokerAddress, list[int]] = {}
        for address, indexes in zip(found, by_secret.values()):
            if isinstance(address, BrokerAddress):
                by_address.setdefault(address, []).extend(indexes)
        counts: list[int | None] = [None] * len(pools)

        async def count(address: BrokerAddress, indexes: list[int]) -> None:
            queues = list(dict.fromkeys(q for i in indexes for q in pools[i][1].queues))
            try:
                ready = await asyncio.to_thread(self._count, address, queues)
            except Exception:  # noqa: BLE001 - the pool's own poll observes and reports it
                log.debug("early notice: the broker at %s not counted", contract.redact(address.url), exc_info=True)
                return
            for i in indexes:
                known = [ready[q] for q in pools[i][1].queues if ready.get(q) is not None]
                counts[i] = sum(known) if known else None

        await asyncio.gather(*(count(address, indexes) for address, indexes in by_address.items()))
        return counts

    def _count(self, address: BrokerAddress, queues: list[str]) -> Mapping[str, int | None]:
        def count(url: str) -> Mapping[str, int | None]:
            if _scheme(url) in contract.PY_AMQP_SCHEMES:
                return self._counter(url).counts(queues)
            from taskherd.queues.redis import ready_counts
            return ready_counts(self._redis_client(url), queues, global_keyprefix=address.global_keyprefix)
        return self._answered(address, count)

    def _answered(self, address: BrokerAddress, call: Callable[[str], Any]) -> Any:
        """``call(url)`` with the pool's broker URL; of a failover list the first that answers
        (taskherd.queues.first_answer), starting from the one that answered last, as kombu's
        connection stays with the broker it reached."""
        return self._failover.call(address.urls, call)

    async def __call__(self, namespace: str, broker: BrokerSpec) -> Observation:
        address = await self._address(namespace, broker)
        queues = list(broker.queues) + list(broker.dead_letter_queues)
        try:
            # the pools of one broker polled together share an inspection (inspection_batch.py): on
            # Redis one pipeline, on RabbitMQ the vhost's listing read in one worker thread
            stats = await self._batches.inspect(address, queues)
        except Exception as exc:  # BrokerUnreachable and anything the client library raises
            raise ObservationError(contract.redact(f"{type(exc).__name__}: {exc}")) from exc
        return aggregate(stats, broker)

    async def _inspect_in_thread(self, address: BrokerAddress, queues: list[str]) -> Mapping[str, Any]:
        inspect = self._inspect or self._inspect_default
        return await asyncio.to_thread(
            self._answered, address, lambda url: inspect(url, queues, management_url=address.management_url,
                                                         global_keyprefix=address.global_keyprefix))


def _judge(namespace: str, broker: BrokerSpec, secret: Mapping[str, str]) -> BrokerAddress | tuple[str, str]:
    """The pool's broker address from its Secret, or why there is none (the message and reason of
    BrokerReachable)."""
    if broker.secret_key not in secret:
        # the key may be the default, which the user never wrote: name the field that sets it
        default = BrokerSpec.__dataclass_fields__["secret_key"].default
        return (f"Secret {namespace}/{broker.secret_name} has no key {broker.secret_key!r} "
                f"(spec.broker.secretRef.key, default {default!r}; keys: {sorted(secret)})",
                "SecretKeyMissing")
    if broker.management_url_key and broker.management_url_key not in secret:
        return (f"Secret {namespace}/{broker.secret_name} has no key {broker.management_url_key!r} "
                f"(spec.broker.secretRef.managementUrlKey; keys: {sorted(secret)})", "SecretKeyMissing")
    # as the pods read them: an environment variable's value is stripped (contract.read), and a
    # Secret made from a file keeps the file's last newline
    url = secret[broker.secret_key].strip()
    management = secret[broker.management_url_key].strip() if broker.management_url_key else None
    problem = secret_values_problem(broker, url, management)
    if problem:
        return f"Secret {namespace}/{broker.secret_name}: {problem}", "SecretValueInvalid"
    first, *failover = contract.failover_urls(url)
    return BrokerAddress(first, management, broker.global_keyprefix, tuple(failover))
