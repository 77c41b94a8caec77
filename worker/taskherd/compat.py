"""The one seam between taskherd and the internals of the libraries it builds on.

kombu, billiard and prometheus_client offer no public hook for a few things taskherd needs (which
worker holds a Redis delivery, the value class of multiprocess metrics, …). Every use of such an
internal goes through a function here, and :data:`INTERNALS` lists each one with the library it
belongs to. ``tests/worker/test_compat.py`` checks every entry against the installed versions, so
an upgrade that changes one fails loudly, naming the library, its version and the internal —
instead of a worker that silently stops recovering or counting.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import time
from importlib import metadata
from typing import Any, Callable


class Internal:
    """An internal taskherd relies on: where it is and what shape it must have."""

    __slots__ = ("library", "path", "kind", "parameters", "why", "set_in")

    def __init__(self, library: str, path: str, kind: str, *, parameters: tuple[str, ...] = (), why: str,
                 set_in: str = "__init__"):
        self.library, self.path, self.kind, self.parameters, self.why = library, path, kind, parameters, why
        #: "instance attributes": the method that sets them
        self.set_in = set_in

    def problem(self) -> str | None:
        """None when the installed library still has it; otherwise what changed."""
        version = _version(self.library)
        try:
            target = _resolve(self.path)
        except (ImportError, AttributeError) as exc:
            return f"{self.library} {version}: {self.path} is gone ({exc}); taskherd uses it to {self.why}"
        if self.kind == "instance attributes":
            # Usually set in __init__, so not visible on the class: read the constructor's source.
            source = inspect.getsource(getattr(target, self.set_in))
            missing = [name for name in self.parameters
                       if not hasattr(target, name) and f"self.{name} =" not in source and f"self.{name}:" not in source]
            if missing:
                return (f"{self.library} {version}: {self.path}.{self.set_in} no longer sets {missing}; "
                        f"taskherd uses them to {self.why}")
            return None
        if self.kind == "class" and not inspect.isclass(target):
            return f"{self.library} {version}: {self.path} is no longer a class; taskherd uses it to {self.why}"
        if self.kind == "callable" and not callable(target):
            return f"{self.library} {version}: {self.path} is no longer callable; taskherd uses it to {self.why}"
        if self.parameters:
            try:
                names = list(inspect.signature(target).parameters)
            except (TypeError, ValueError):
                names = []
            missing = [name for name in self.parameters if name not in names]
            if missing:
                return (f"{self.library} {version}: {self.path}{inspect.signature(target)} lacks "
                        f"parameter(s) {missing}; taskherd uses it to {self.why}")
        return None


def _version(library: str) -> str:
    try:
        return metadata.version(library)
    except metadata.PackageNotFoundError:
        return "(not installed)"


def _resolve(path: str) -> Any:
    module_name, _, attributes = path.partition(":")
    target: Any = importlib.import_module(module_name)
    for attribute in attributes.split(".") if attributes else ():
        target = getattr(target, attribute)
    return target


INTERNALS: tuple[Internal, ...] = (
    # Redis fast recovery (taskherd.worker.components.recovery): a QoS subclass records which worker
    # holds each delivery in the same MULTI/EXEC as kombu's own bookkeeping.
    Internal("kombu", "kombu.transport.redis:Channel.QoS", "class",
             why="record which worker holds each Redis delivery"),
    Internal("kombu", "kombu.transport.redis:QoS.append", "callable", parameters=("message", "delivery_tag"),
             why="record which worker holds each Redis delivery"),
    Internal("kombu", "kombu.transport.redis:QoS.pipe_or_acquire", "callable",
             why="write taskherd's delivery record in kombu's own transaction"),
    Internal("kombu", "kombu.transport.redis:QoS.unacked_key", "attribute",
             why="find the unacked hash of a Redis channel"),
    Internal("kombu", "kombu.transport.redis:QoS.unacked_index_key", "attribute",
             why="find the unacked index of a Redis channel"),
    Internal("kombu", "kombu.transport.redis:QoS._remove_from_indices", "callable", parameters=("delivery_tag",),
             why="remove a delivery from kombu's indices when restoring it"),
    Internal("kombu", "kombu.transport.redis:Channel._do_restore_message", "callable",
             parameters=("payload", "exchange", "routing_key", "pipe", "leftmost"),
             why="put a dead worker's delivery back on its queue exactly as kombu does"),
    Internal("kombu", "kombu.transport.redis:Channel._get_message_priority", "callable",
             why="compute the priority list a restored delivery goes back to"),
    Internal("kombu", "kombu.transport.redis:Channel.queue_purge", "callable", parameters=("queue",),
             why="erase a purged queue's parked ETA messages with it (taskherd.worker.delayed)"),
    Internal("kombu", "kombu.transport.redis:Channel.pool", "attribute",
             why="reach a purging channel's Redis database (taskherd.worker.delayed)"),
    Internal("kombu", "kombu.transport.redis:Channel._q_for_pri", "callable", parameters=("queue", "pri"),
             why="compute the priority list a restored delivery goes back to"),
    Internal("kombu", "kombu.transport.redis:Channel._lookup", "callable", parameters=("exchange", "routing_key"),
             why="find the queues a restored delivery goes back to"),
    Internal("kombu", "kombu.transport.virtual:QoS.append", "callable", why="keep kombu's in-memory delivery table"),
    Internal("kombu", "kombu.transport.virtual:QoS.ack", "callable", why="keep kombu's in-memory delivery table"),
    # Metrics under prefork (taskherd.worker.components.metrics, taskherd.worker.metric_values).
    Internal("prometheus-client", "prometheus_client.values:ValueClass", "attribute",
             why="switch metrics created from worker_init on to taskherd's multiprocess value class"),
    Internal("prometheus-client", "prometheus_client.mmap_dict:mmap_key", "callable",
             parameters=("metric_name", "name", "labelnames", "labelvalues", "help_text"),
             why="key a sample in the multiprocess files as prometheus_client's collector reads it"),
    Internal("prometheus-client", "prometheus_client.mmap_dict:MmapedDict.read_value", "callable",
             parameters=("key",), why="read a sample of the multiprocess files"),
    Internal("prometheus-client", "prometheus_client.mmap_dict:MmapedDict.write_value", "callable",
             parameters=("key", "value", "timestamp"), why="write a sample of the multiprocess files"),
    Internal("prometheus-client", "prometheus_client.mmap_dict:MmapedDict", "instance attributes",
             parameters=("_positions", "_m"), why="write a task's samples in place (compat.sample_writer)"),
    Internal("prometheus-client", "prometheus_client.metrics:Counter", "instance attributes", parameters=("_value",),
             set_in="_metric_init", why="write a task's samples under one lock (taskherd.worker.metric_values)"),
    Internal("prometheus-client", "prometheus_client.metrics:Gauge", "instance attributes", parameters=("_value",),
             set_in="_metric_init", why="write a task's samples under one lock (taskherd.worker.metric_values)"),
    Internal("prometheus-client", "prometheus_client.metrics:Histogram", "instance attributes",
             parameters=("_sum", "_buckets"), set_in="_metric_init",
             why="write a task's samples under one lock (taskherd.worker.metric_values)"),
    Internal("prometheus-client", "prometheus_client.metrics:Histogram", "instance attributes",
             parameters=("_upper_bounds",), set_in="_prepare_buckets",
             why="find a task's histogram bucket (taskherd.worker.metric_values)"),
    Internal("prometheus-client", "prometheus_client.mmap_dict:MmapedDict", "class",
             why="fold the metric files of dead pool processes into one archive"),
    Internal("prometheus-client", "prometheus_client.mmap_dict:MmapedDict.read_all_values_from_file", "callable",
             why="fold the metric files of dead pool processes into one archive"),
    # Drain (taskherd.worker.components.drain): messages held but not started go back.
    Internal("celery", "celery.worker.state:scheduled_requests", "attribute",
             why="give back ETA/countdown messages a draining worker holds"),
    Internal("celery", "celery.worker:WorkController._process_task", "callable", parameters=("req",),
             why="keep a request the pool cannot take from holding its pool slot for ever"),
    Internal("celery", "celery.worker:WorkController._process_task_sem", "callable", parameters=("req",),
             why="keep a request the pool cannot take from holding its pool slot for ever"),
    Internal("celery", "celery.worker.state:task_ready", "callable", parameters=("request",),
             why="keep a request the pool cannot take from holding its pool slot for ever"),
    Internal("celery", "celery.worker.consumer.consumer:Consumer.cancel_task_queue", "callable",
             parameters=("queue",), why="stop consuming when draining"),
    Internal("billiard", "billiard.pool:ApplyResult", "instance attributes",
             parameters=("_accepted", "_write_to", "_job"),
             why="tell a job no pool child has seen from one that started, when draining"),
    Internal("billiard", "billiard.pool:Pool", "instance attributes", parameters=("_cache",),
             why="take back a job no pool child has seen, when draining"),
    Internal("celery", "celery.concurrency.asynpool:AsynPool", "instance attributes", parameters=("outbound_buffer",),
             why="take back a job no pool child has seen, when draining"),
    # Bad messages (taskherd.worker.components.bad_messages): a Redis list item kombu cannot parse
    # is caught between the pop and kombu's parse (taskherd.worker.redis_items).
    Internal("kombu", "kombu.transport.redis:Channel._get_client", "callable",
             why="check each item a Redis channel pops before kombu parses it"),
    Internal("kombu", "kombu.transport.redis:Channel._brpop_read", "callable",
             why="check each item a Redis channel pops before kombu parses it (it reads BRPOP "
                 "through its client's parse_response)"),
    # Redis fast recovery: a message is popped and recorded as this worker's in one script, in
    # place of BRPOP (taskherd.worker.components.recovery: POP_SCRIPT, _pop_start, _pop_read).
    Internal("kombu", "kombu.transport.redis:Channel._brpop_start", "callable", parameters=("timeout",),
             why="pop a Redis message and record which worker holds it in one step"),
    Internal("kombu", "kombu.transport.redis:Channel", "instance attributes",
             parameters=("_queue_cycle", "_in_poll", "_brpop_sent_at", "active_queues", "brpop_timeout"),
             why="pop a Redis message and record which worker holds it in one step"),
    Internal("kombu", "kombu.transport.redis:Channel.priority_steps", "attribute",
             why="pop from a Redis queue's priority lists in kombu's order"),
    Internal("kombu", "kombu.transport.virtual:Transport._deliver", "callable", parameters=("message", "queue"),
             why="deliver a popped Redis message to its consumer as kombu's BRPOP reader does"),
    Internal("kombu", "kombu.transport.redis:Channel.sep", "attribute",
             why="name the queue of a priority list an unreadable item was popped from"),
    Internal("kombu", "kombu.transport.virtual:Channel.codecs", "attribute",
             why="check a Redis item's body_encoding as kombu will decode it"),
    Internal("redis", "redis.client:Redis.parse_response", "callable", parameters=("connection", "command_name"),
             why="check each item a Redis channel pops before kombu parses it"),
    # The idempotency store (taskherd.worker.idempotency): its scripts on a connection's own socket,
    # and the commands an effect queued, sent with the commit's check in one packet.
    Internal("redis", "redis.connection:AbstractConnection", "instance attributes", parameters=("_sock",),
             why="send the idempotency store's scripts on a connection's socket (compat.redis_socket)"),
    Internal("redis", "redis.client:Pipeline", "instance attributes", parameters=("command_stack",),
             why="send the commands an idempotent effect queued in the commit's one packet "
                 "(compat.redis_queued_commands)"),
    # Bad messages: a task's argument check, as apply_async runs it (celery.app.task).
    Internal("celery", "celery.utils.functional:head_from_fun", "callable", parameters=("fun", "bound"),
             why="check a message's arguments against its task's signature before it reaches the pool"),
    # Hard time limits (taskherd.worker.task): the main process's side of a task.
    Internal("celery", "celery.worker.request:Request.on_timeout", "callable", parameters=("soft", "timeout"),
             why="dead-letter a task killed by its hard time limit"),
    # billiard sets a hard-timed-out job's result (Request.on_failure, which acks) before it calls
    # the timeout handler: the envelope has to be published from on_failure.
    Internal("celery", "celery.worker.request:Request.on_failure", "callable",
             parameters=("exc_info", "send_failed_event", "return_ok"),
             why="dead-letter a task killed by its hard time limit before Celery acknowledges it"),
    Internal("celery", "celery.worker.request:Request", "instance attributes",
             parameters=("_message", "_payload", "_request_dict"),
             why="rebuild a task's envelope in the main process and put its message back on its queue"),
    # The soft time limit is a signal billiard sends to the pool child (taskherd.worker.soft_limit).
    Internal("billiard", "billiard.pool:SIG_SOFT_TIMEOUT", "attribute",
             why="hold the soft time limit back while an envelope or a retry is published"),
    Internal("billiard", "billiard.pool:soft_timeout_sighandler", "callable",
             why="recognise the pool child's soft time limit handler"),
    # Delayed (ETA/countdown) messages on Redis (taskherd.worker.delayed) and fast recovery: the
    # message exactly as the transport stored it, to store it again.
    Internal("kombu", "kombu.transport.virtual:Message", "instance attributes", parameters=("_raw",),
             why="store a Redis delivery again exactly as kombu stored it (delay set, recovery records)"),
    Internal("celery", "celery.worker.strategy:default", "callable", parameters=("task", "app", "consumer"),
             why="take ETA/countdown messages out of the worker into the Redis delay set"),
    Internal("celery", "celery.app.amqp:AMQP.create_task_message", "attribute",
             why="refuse, at publish, a time limit that Redis would cut short by redelivering"),
    Internal("celery", "celery.app.amqp:AMQP.as_task_v2", "callable",
             parameters=("task_id", "name", "time_limit", "soft_time_limit"),
             why="refuse, at publish, a time limit that Redis would cut short by redelivering"),
    # A task created with base= (taskherd.worker.components.task_class): Celery makes that class its
    # only base, leaving out the app's default Task class.
    Internal("celery", "celery.app.base:Celery._task_from_fun", "callable", parameters=("fun", "name", "base"),
             why="give a task created with base= taskherd's Task class too"),
    # A delivered message's AMQP properties, read by taskherd.worker.amqp_properties (the same
    # result as py-amqp's decoder, which it hands the rare value types and every malformed frame).
    Internal("amqp", "amqp.serialization:PROPERTY_CLASSES", "attribute",
             why="read a delivered message's AMQP properties and headers in 40 % fewer instructions"),
    Internal("amqp", "amqp.serialization:decode_properties_basic", "callable", parameters=("buf", "offset"),
             why="decode the AMQP properties (and malformed frames) taskherd's decoder leaves to py-amqp"),
    Internal("amqp", "amqp.serialization:_read_item", "callable", parameters=("buf", "offset"),
             why="decode the header value types taskherd's decoder leaves to py-amqp (decimal, timestamp...)"),
    Internal("amqp", "amqp.spec:Basic.CLASS_ID", "attribute",
             why="find py-amqp's decoder of the basic class's properties"),
    # Each task's request context (taskherd.worker.components.request_context): Celery's tracer
    # builds it from its module's Context; taskherd's subclass finds the custom headers in one pass.
    Internal("celery", "celery.app.trace:Context", "class",
             why="build each task's request context with its custom headers found in one pass"),
    Internal("celery", "celery.app.task:Context._get_custom_headers", "callable",
             why="find a request's custom headers in one pass (the same headers, in the same order)"),
    # A task's result text (taskherd.worker.components.result_repr): the tracer writes it with its
    # module's saferepr.
    Internal("celery", "celery.app.trace:saferepr", "callable", parameters=("o", "maxlen", "maxlevels", "seen"),
             why="write a task's None, True or False result without the general repr machinery"),
    # JSON bodies (taskherd.worker.components.json_bodies): the decoder kombu's registry holds for
    # application/json, read to leave an app's own in place.
    Internal("kombu", "kombu.serialization:registry", "instance attributes", parameters=("_decoders",),
             why="decode JSON bodies with one JSONDecoder, unless the app registered its own decoder"),
    Internal("kombu", "kombu.utils.json:object_hook", "callable", parameters=("o",),
             why="decode JSON bodies as kombu does (the types kombu and Celery register)"),
    # The event loop's timers (taskherd.worker.components.timer_heap): a cancelled timer stays in
    # the heap until it would have fired.
    Internal("kombu", "kombu.asynchronous.timer:Timer", "instance attributes", parameters=("_queue",),
             why="drop the cancelled soft-time-limit timers of finished tasks from the event loop's heap"),
    Internal("kombu", "kombu.asynchronous.timer:Entry", "instance attributes", parameters=("canceled",),
             why="drop the cancelled soft-time-limit timers of finished tasks from the event loop's heap"),
    # The PostgreSQL idempotency guard (taskherd.worker.idempotency.postgres_store): psycopg has no
    # public "inside a conn.transaction() block".
    Internal("psycopg", "psycopg._connection_base:BaseConnection", "instance attributes",
             parameters=("_num_transactions",),
             why="refuse a guard in an implicit transaction nothing commits (the key and the effect would be lost)"),
)


def problems() -> list[str]:
    """What changed in the installed libraries, one line per internal taskherd relies on."""
    return [problem for problem in (internal.problem() for internal in INTERNALS) if problem]


# -- the uses themselves ---------------------------------------------------------------------------
def use_multiprocess_value_class() -> None:
    """prometheus_client picks its value class at import time; metrics created from now on (here
    and, after fork, in the pool children) write to $PROMETHEUS_MULTIPROC_DIR through
    taskherd.worker.metric_values (prometheus_client's files and keys, several samples per lock)."""
    from prometheus_client import values

    from taskherd.worker.metric_values import MultiProcessValue

    values.ValueClass = MultiProcessValue


def use_amqp_properties_decoder() -> bool:
    """Makes taskherd.worker.amqp_properties py-amqp's decoder of delivered messages' properties,
    in this process (py-amqp looks the decoder up in PROPERTY_CLASSES for each content header).
    Idempotent; False when it was installed already."""
    from amqp import serialization
    from amqp.spec import Basic

    from taskherd.worker.amqp_properties import decoder

    current = serialization.PROPERTY_CLASSES[Basic.CLASS_ID]
    if getattr(current, "slow", None) is not None:
        return False
    serialization.PROPERTY_CLASSES[Basic.CLASS_ID] = decoder(current, serialization._read_item)
    return True


def use_tracer_context_class(context_class: type) -> None:
    """Makes ``context_class`` (a subclass of Celery's Context) the class Celery's tracer builds each
    task's request context from, in this process and the pool children it forks from now on."""
    from celery.app import trace

    trace.Context = context_class


def use_tracer_result_repr(result_repr: Callable[..., str]) -> None:
    """Makes ``result_repr`` (saferepr's signature and text) the function Celery's tracer writes each
    task's result text with, in this process and the pool children it forks from now on."""
    from celery.app import trace

    trace.saferepr = result_repr


def use_json_body_decoder(decoder: Callable[[Any], Any], *, replacing: Callable[[Any], Any]) -> bool:
    """Registers ``decoder`` as kombu's decoder of application/json bodies if the registry still
    holds ``replacing`` (kombu's own; an app's own decoder stays). True when it did."""
    from kombu.serialization import registry

    if registry._decoders.get("application/json") is not replacing:
        return False
    registry.register("json", None, decoder, content_type="application/json", content_encoding="utf-8")
    return True


def metric_key(metric_name: str, name: str, labelnames: Any, labelvalues: Any, help_text: str) -> str:
    """A sample's key in a multiprocess file, as prometheus_client's collector reads it back."""
    from prometheus_client.mmap_dict import mmap_key

    return mmap_key(metric_name, name, labelnames, labelvalues, help_text)


def sample_writer(file: Any, key: str) -> Callable[[float], None]:
    """A function writing a sample's value (timestamp 0) to its place in a multiprocess file
    (``MmapedDict.write_value`` less its key lookup and two calls: a task writes seven). The
    place of a key never moves; the mmap does when the file grows, so it is read at each write."""
    import struct

    file.read_value(key)  # gives a new key its place
    start = file._positions[key]
    end = start + 16
    pack = struct.Struct("dd").pack

    def write(value: float) -> None:
        # Assigned whole, as prometheus_client writes (struct.pack_into would show a reader 0 midway).
        file._m[start:end] = pack(value, 0.0)

    return write


def sample_value(child: Any) -> Any:
    """The value object of a labelled Counter or Gauge (``metric.labels(...)``)."""
    return child._value


def histogram_values(child: Any) -> tuple[Any, tuple[Any, ...], tuple[float, ...]]:
    """(value of the sum, values of the buckets, the buckets' upper bounds ending with +Inf) of a
    labelled Histogram: an observation adds to the sum and to the first bucket whose bound is >= it."""
    return child._sum, tuple(child._buckets), tuple(child._upper_bounds)


def filterable_registry():
    """A CollectorRegistry whose scrape honours ``?name[]=`` (prometheus_client's filter) for
    collectors that cannot name their series up front, as the multiprocess one; such collectors
    are otherwise left out of a filtered scrape altogether. prometheus_client before the option
    existed: a plain registry (a filtered scrape answers nothing; the operator then asks again
    without the filter)."""
    from prometheus_client import CollectorRegistry

    try:
        return CollectorRegistry(auto_describe=False, support_collectors_without_names=True)
    except TypeError:
        return CollectorRegistry(auto_describe=False)


def read_metric_file(path: str):
    """(key, value, timestamp, position) of every sample in a prometheus_client multiprocess file."""
    from prometheus_client.mmap_dict import MmapedDict

    return MmapedDict.read_all_values_from_file(path)


def metric_file_writer(path: str):
    """A prometheus_client multiprocess file opened for writing (``write_value``, ``close``)."""
    from prometheus_client.mmap_dict import MmapedDict

    return MmapedDict(path)


def soft_time_limit_signal() -> int | None:
    """The signal that raises SoftTimeLimitExceeded in this process, if billiard's handler is on it
    (a prefork pool child); None elsewhere (the main process, the solo and thread pools)."""
    import signal

    from billiard import pool

    signum = pool.SIG_SOFT_TIMEOUT
    if signum is None or signal.getsignal(signum) is not pool.soft_timeout_sighandler:
        return None
    return signum


def drop_cancelled_timers(timer: Any) -> int | None:
    """Removes the cancelled entries from a kombu event-loop Timer's heap, in place (its scheduler
    holds the same list), and returns how many; None for a timer of another kind (the solo and
    thread pools' threaded timer)."""
    import heapq

    from kombu.asynchronous.timer import Timer

    if type(timer) is not Timer:
        return None
    queue = timer._queue
    live = [event for event in queue if not event[2].canceled]  # scheduled(eta, priority, entry)
    dropped = len(queue) - len(live)
    if dropped:
        heapq.heapify(live)
        queue[:] = live
    return dropped


def guard_pool_submission(controller: Any, consumer: Any, *, on_refused: Callable[[Any, Exception], None],
                          passes_through: Callable[[Exception], bool]) -> bool:
    """Has an exception raised while Celery hands a request to the pool go to
    ``on_refused(request, exc)`` instead of escaping, after the pool slot it took is given back
    and the request is forgotten as reserved. Returns False when ``controller`` is not a
    WorkController this applies to (a consumer built without one, in tests).

    Why: with prefork Celery takes a slot of its semaphore, then calls ``_process_task``, which
    checks whether the request was revoked and pickles it for a child. A message that makes either
    raise (``stamped_headers: 5``; headers nested too deep to pickle) left the slot taken for good —
    after ``concurrency`` of them the worker took nothing more, alive and consuming — or, raised from
    the semaphore's release or the ETA timer, ended up where Celery does not expect it.
    ``passes_through(exc)`` picks the exceptions still raised once the slot is back (a lost
    connection, for the consumer to recover from)."""
    if controller is None or not callable(getattr(controller, "_process_task", None)):
        return False
    from celery.worker.state import task_ready

    submit = controller._process_task
    under_semaphore = getattr(controller, "process_task", None) == getattr(controller, "_process_task_sem", None)
    release = controller._quick_release if under_semaphore else None

    def process_task(req: Any) -> None:
        try:
            submit(req)
        except Exception as exc:  # noqa: BLE001 - what the message did to the pool hand-off
            task_ready(req)
            if release is not None:
                release()  # may hand the slot straight to the next waiting request
            if passes_through(exc):
                raise
            on_refused(req, exc)

    # _process_task_sem looks the method up on the instance at each call; without a semaphore the
    # consumer calls process_task directly.
    controller._process_task = process_task
    if not under_semaphore:
        controller.process_task = consumer.on_task_request = process_task
    return True


def default_strategy():
    """Celery's default task strategy: how the worker turns a message into a request."""
    from celery.worker.strategy import default

    return default


def task_message_creator(app: Any):
    """The function through which ``app`` builds every task message it publishes."""
    return app.amqp.create_task_message


def set_task_message_creator(app: Any, create) -> None:
    app.amqp.create_task_message = create  # a cached_property: the instance attribute wins


def set_task_base_chooser(app: Any, choose: Callable[[Any], Any]) -> None:
    """Every task ``app`` creates from a function (``@app.task``, ``@shared_task``) gets the base
    class ``choose(base)`` returns for the ``base=`` it was given (None: the app's default)."""
    create = app._task_from_fun
    create = getattr(create, "taskherd_unchosen", create)  # configure() ran before: replace the chooser

    def created(fun: Any, name: Any = None, base: Any = None, **options: Any) -> Any:
        return create(fun, name=name, base=choose(base), **options)

    created.taskherd_unchosen = create
    app._task_from_fun = created


def set_redis_qos_class(qos_class: type) -> None:
    """Makes every kombu Redis channel of this process use ``qos_class``."""
    from kombu.transport import redis as kombu_redis

    kombu_redis.Channel.QoS = qos_class


def redis_qos_base() -> type:
    from kombu.transport import redis as kombu_redis

    return kombu_redis.QoS


def redis_item_guard() -> Callable[..., Any] | None:
    """The guard :func:`guard_redis_items` installed, as ``guard(item, list_key, **kwargs)`` (the
    list key without the global_keyprefix), or None: for a pop made outside kombu's BRPOP."""
    from kombu.transport import redis as kombu_redis

    return getattr(kombu_redis.Channel._get_client, "taskherd_guard", None)


def guard_redis_items(guard: Callable[[Any, str], Any]) -> None:
    """Makes every kombu Redis channel of this process pass each item it pops off a queue list
    (BRPOP when consuming, RPOP for ``basic_get``) through ``guard(item, queue)`` and parse what
    ``guard`` returns instead. Installing a guard again replaces the previous one."""
    from kombu.transport import redis as kombu_redis

    channel = kombu_redis.Channel
    original = getattr(channel._get_client, "taskherd_original", channel._get_client)
    separator = channel.sep
    classes: dict[type, type] = {}

    def queue_of(list_key: Any) -> str:
        # The key comes without the global_keyprefix (kombu's client strips it) but may carry a
        # priority suffix: <queue><sep><priority>.
        name = list_key.decode("utf-8", "replace") if isinstance(list_key, bytes) else str(list_key)
        return name.rsplit(separator, 1)[0]

    def guarded_class(base: type) -> type:
        if base not in classes:
            class GuardedRedis(base):
                def parse_response(self, connection, command_name, **options):
                    response = super().parse_response(connection, command_name, **options)
                    if command_name == "BRPOP" and response:
                        list_key, item = response
                        return list_key, guard(item, queue_of(list_key))
                    return response

                def rpop(self, name, count=None):
                    item = super().rpop(name, count)
                    return guard(item, queue_of(name)) if count is None and item is not None else item

            classes[base] = GuardedRedis
        return classes[base]

    def _get_client(self):
        client = original(self)
        if isinstance(client, functools.partial):  # kombu's prefixed client, with its prefix bound
            return functools.partial(guarded_class(client.func), *client.args, **client.keywords)
        return guarded_class(client)

    _get_client.taskherd_original = original
    _get_client.taskherd_guard = lambda item, list_key, **kwargs: guard(item, queue_of(list_key), **kwargs)
    channel._get_client = _get_client


def wrap_redis_brpop(start: Callable[..., Any], read: Callable[..., Any]) -> None:
    """Makes every kombu Redis channel of this process call ``start(channel, kombus_start, timeout)``
    where it would send BRPOP to wait for its next message, and ``read(channel, kombus_read,
    **options)`` where it would read BRPOP's reply (kombu's own functions are passed in, for the
    cases the wrapper leaves to them). Wrapping again replaces the previous wrappers."""
    from kombu.transport import redis as kombu_redis

    channel = kombu_redis.Channel
    original_start = getattr(channel._brpop_start, "taskherd_original", channel._brpop_start)
    original_read = getattr(channel._brpop_read, "taskherd_original", channel._brpop_read)

    def _brpop_start(self, timeout=None):
        return start(self, original_start, timeout)

    def _brpop_read(self, **options):
        return read(self, original_read, **options)

    _brpop_start.taskherd_original, _brpop_read.taskherd_original = original_start, original_read
    channel._brpop_start, channel._brpop_read = _brpop_start, _brpop_read


def redis_socket(connection: Any) -> Any:
    """A redis-py connection's socket (None until it connects)."""
    return connection._sock


def redis_queued_commands(pipeline: Any) -> list[tuple[Any, ...]]:
    """The arguments of each command queued on a redis-py pipeline that has not run, in order."""
    return [args for args, _options in pipeline.command_stack]


def redis_consumed_lists(channel: Any) -> list[str]:
    """The lists a consuming Redis channel's BRPOP would wait on, in kombu's order (each queue's
    priority lists, highest first), without the global_keyprefix."""
    queues = channel._queue_cycle.consume(len(channel.active_queues))
    return [channel._q_for_pri(queue, pri) for pri in channel.priority_steps for queue in queues]


def redis_queue_lists(channel: Any, queue: str) -> list[str]:
    """The Redis lists of one queue on a kombu Redis channel (its priority lists, highest first),
    without the global_keyprefix."""
    return list(dict.fromkeys(channel._q_for_pri(queue, pri) for pri in channel.priority_steps))


def redis_channel_client(channel: Any) -> Any:
    """A redis-py client on a kombu Redis channel's connection pool (its database), whose key
    names are NOT given the channel's global_keyprefix."""
    import redis

    return redis.Redis(connection_pool=channel.pool)


def wrap_redis_queue_purge(wrapper: Callable[[Callable[..., int]], Callable[..., int]]) -> None:
    """Replaces kombu's Redis ``Channel.queue_purge(self, queue, **kwargs)`` with
    ``wrapper(original)``, once (what every purge of a Redis queue calls: ``celery purge``, a
    worker's ``--purge``, ``app.control.purge``)."""
    from kombu.transport import redis as kombu_redis

    current = kombu_redis.Channel.queue_purge
    if getattr(current, "taskherd_wrapped", False):
        return
    replacement = wrapper(current)
    replacement.taskherd_wrapped = True
    replacement.__wrapped__ = current
    kombu_redis.Channel.queue_purge = replacement


def redis_brpop_timeout(channel: Any, timeout: float | None) -> float:
    return channel.brpop_timeout if timeout is None else timeout


def redis_send_poll(channel: Any, *command: Any) -> None:
    """Sends `command` on the channel's consuming connection the way kombu sends BRPOP (no key
    prefixing: the caller's keys are complete), so that kombu's poller waits for its reply."""
    channel._in_poll = channel.client.connection
    channel._brpop_sent_at = time.monotonic()
    channel.client.connection.send_command(*command)


def redis_read_poll(channel: Any, command_name: str, **options: Any) -> Any:
    """Reads the reply to :func:`redis_send_poll` the way kombu reads BRPOP's."""
    try:
        try:
            return channel.client.parse_response(channel.client.connection, command_name, **options)
        except channel.connection_errors:
            channel.client.connection.disconnect()  # the next poll reconnects
            raise
    finally:
        channel._in_poll = None
        flush = getattr(channel, "_flush_brpop_reauth", None)
        if flush is not None:
            flush()


def redis_deliver_popped(channel: Any, reply: Any) -> bool:
    """Delivers a BRPOP-shaped reply (list key, item) to the channel's consumer exactly as kombu's
    ``_brpop_read`` does after reading one."""
    from kombu.utils.encoding import bytes_to_str
    from kombu.utils.json import loads

    list_key, item = reply
    queue = bytes_to_str(list_key).rsplit(channel.sep, 1)[0]
    channel._queue_cycle.rotate(queue)
    channel.connection._deliver(loads(bytes_to_str(item)), queue)
    return True


def redis_item_loads(item: Any) -> Any:
    """A popped Redis item parsed exactly as kombu's Redis channel parses it."""
    from kombu.utils.encoding import bytes_to_str
    from kombu.utils.json import loads

    return loads(bytes_to_str(item))


def redis_body_codecs() -> dict[str, Any]:
    """kombu's body encodings of virtual transports by name (``{"base64": …}``): each ``.decode(body)``."""
    from kombu.transport import virtual

    return dict(virtual.Channel.codecs)


def argument_checker(task: Any) -> Callable[..., Any] | None:
    """The function ``apply_async`` calls to check a task's arguments against its signature
    (raising TypeError), or None when the task has none or opted out (``typing=False``)."""
    if not getattr(task, "typing", False):
        return None
    return getattr(task, "__header__", None)
