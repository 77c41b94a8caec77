"""Reading how busy a worker pod is: the worker's Prometheus endpoint, over the pod IP.

Why metrics rather than `kubectl exec taskherd probe`: an HTTP GET needs no `pods/exec` RBAC
(exec is close to root in the pod), no websocket stream and no process fork in the worker; the
worker serves `taskherd_tasks_in_flight` on its metrics port anyway. The same text carries the
worker's finished-task count, the seconds those tasks took and its slots, from which the operator
estimates the pool's throughput (taskherd.operator.throughput). The reader is injectable: handlers
take any `async (pod) -> PodReading | None`.
"""
from __future__ import annotations

import asyncio
import re
import socket
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterable, Mapping
from urllib.parse import urlencode

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from taskherd.contract import WORKER_METRICS_PORT

from .deletion_cost import PodBusyness

IN_FLIGHT_METRIC = "taskherd_tasks_in_flight"
#: the runtime histogram: its _count is the tasks a worker finished, its _sum the seconds they took
RUNTIME_METRIC = "taskherd_task_runtime_seconds"
SLOTS_METRIC = "taskherd_worker_slots"
#: in every worker's scrape, whatever its version: an answer without it is not a filtered one
BUILD_INFO_METRIC = "taskherd_build_info"


@dataclass(frozen=True)
class PodReading:
    """What one worker's /metrics says: tasks in flight, and its counters for the throughput."""

    in_flight: int | None
    completed: float | None = None
    busy_seconds: float | None = None
    slots: int | None = None


BusynessReader = Callable[[Mapping[str, Any]], Awaitable["PodReading | None"]]


def lines_starting(text: str, prefixes: Iterable[str]) -> list[str]:
    """The lines of `text` that start with one of `prefixes`, found by the string search rather
    than by looking at every line: a worker serves a few hundred, and the operator wants a few."""
    text = "\n" + text
    lines = []
    for prefix in prefixes:
        at = text.find("\n" + prefix)
        while at != -1:
            end = text.find("\n", at + 1)
            lines.append(text[at + 1:end if end != -1 else len(text)].rstrip("\r"))
            at = text.find("\n" + prefix, at + 1)
    return lines


def samples_named(text: str, names: Iterable[str]) -> list[Sample] | None:
    """The samples called one of `names`, with their labels, in a scrape in the Prometheus text
    format; None when their lines do not parse. Only their lines go to prometheus_client's parser,
    which spends about 13 µs of CPU per line (3.5 ms on a worker's few hundred, per pod and
    reading): for samples that are rare, such as the pool-child deaths."""
    wanted = frozenset(names)
    lines = lines_starting(text, sorted(wanted))
    if not lines:
        return []
    try:
        return [sample for family in text_string_to_metric_families("\n".join(lines) + "\n")
                for sample in family.samples if sample.name in wanted]
    except ValueError:
        return None


#: the samples a reading sums over their label sets (and asks the worker for: WorkerMetrics names)
READING_SAMPLES = (IN_FLIGHT_METRIC, RUNTIME_METRIC + "_count", RUNTIME_METRIC + "_sum", SLOTS_METRIC)


#: a line of one of READING_SAMPLES: `name{labels} value [timestamp]`. Label values are quoted and
#: may hold spaces, braces and escapes, but the value and the timestamp hold no brace: the line's
#: last `}` closes the label set (the greedy `.*`, which stops at the line's end)
_READING_LINE = re.compile(r"^(" + "|".join(map(re.escape, READING_SAMPLES)) + r")(?:\{.*\})?[ \t]+(\S+)", re.M)


def parse_reading(text: str) -> PodReading | None:
    """In-flight tasks, finished tasks, their summed runtime and the slots, each summed over its
    label sets, from one scrape in the Prometheus text format; None when none of them is there.

    Only the lines of these four samples are read, by one regular expression over the text (the
    scan in C): prometheus_client's parser spends about 13 µs of CPU per line, 3.5 ms on a
    worker's whole scrape, and a line-by-line parse in Python was a sixth of the operator's CPU
    at 1,000 pools (bench/operator_scale.py). A value that is not a number is left out."""
    sums: dict[str, float] = {}
    for name, value in _READING_LINE.findall(text):
        try:
            number = float(value)
        except ValueError:
            continue
        sums[name] = sums.get(name, 0.0) + number
    if not sums:
        return None
    in_flight, slots = sums.get(IN_FLIGHT_METRIC), sums.get(SLOTS_METRIC)
    return PodReading(in_flight=None if in_flight is None else int(round(in_flight)),
                      completed=sums.get(RUNTIME_METRIC + "_count"), busy_seconds=sums.get(RUNTIME_METRIC + "_sum"),
                      slots=int(slots) if slots and slots >= 1 else None)


def pod_is_running(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return status.get("phase") == "Running" and bool(status.get("podIP"))


#: a worker serves tens of kilobytes; a pod answering more is not a worker to trust with memory
MAX_RESPONSE_BYTES = 8 * 1024 * 1024


class WorkerMetrics:
    """GET http://<podIP>:<port>/metrics of a worker pod: the text, or None when it cannot be read.

    One HTTP/1.0 request on a connection of its own, read to the end: the worker's server
    (wsgiref) answers every request that way and closes, so a client's connection pool has
    nothing to reuse, and httpx's machinery cost 3.5-4.3 ms of CPU per request here against the
    fraction of a millisecond this takes (bench/operator_scale.py): the operator reads every pod
    of a pool that is scaling. A text read less than `reuse_seconds` ago is served again, so that
    the busyness and the pool-child deaths of one poll cost one request per pod.

    With `names`, the request asks for those series only (``?name[]=``, prometheus_client's own
    filter): a few hundred bytes instead of the ~20 KB of a worker's whole scrape, a third of the
    CPU of a reading. A worker that cannot filter (an older version) answers nothing or
    everything; without its always-present ``taskherd_build_info`` in the answer, the whole
    scrape is asked for again.
    """

    def __init__(self, *, port: int = WORKER_METRICS_PORT, timeout: float = 2.0, reuse_seconds: float = 1.0,
                 names: Iterable[str] = (), clock: Callable[[], float] = time.monotonic) -> None:
        self.port = port
        self.timeout = timeout
        self.reuse_seconds = reuse_seconds
        self._clock = clock
        self._recent: dict[str, tuple[float, str | None]] = {}
        self._path = "/metrics"
        if names:
            query = urlencode([("name[]", name) for name in (*names, BUILD_INFO_METRIC)])
            self._path = f"/metrics?{query}"

    async def text(self, pod: Mapping[str, Any]) -> str | None:
        ip = (pod.get("status") or {}).get("podIP")
        if not ip:
            return None
        now = self._clock()
        self._recent = {key: kept for key, kept in self._recent.items() if now - kept[0] < self.reuse_seconds}
        if ip in self._recent:
            return self._recent[ip][1]
        try:
            async with asyncio.timeout(self.timeout):
                text = await self._get(ip, self._path)
                if text is not None and self._path != "/metrics" and BUILD_INFO_METRIC not in text:
                    text = await self._get(ip, "/metrics")  # a worker that cannot filter
        except (OSError, TimeoutError, ValueError):
            text = None
        self._recent[ip] = (now, text)
        return text

    async def _get(self, ip: str, path: str) -> str | None:
        # The event loop's socket calls, not streams: a third less CPU per request (no transport,
        # protocol and buffer objects for a connection that lives for one response).
        loop = asyncio.get_running_loop()
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setblocking(False)
            await loop.sock_connect(sock, (ip, self.port))
            host = f"[{ip}]" if family == socket.AF_INET6 else ip
            await loop.sock_sendall(sock, f"GET {path} HTTP/1.0\r\nHost: {host}:{self.port}\r\n\r\n".encode())
            response = bytearray()
            while chunk := await loop.sock_recv(sock, 262144):  # HTTP/1.0: the body ends with the connection
                response += chunk
                if len(response) > MAX_RESPONSE_BYTES:
                    raise ValueError(f"{ip}:{self.port}/metrics is over {MAX_RESPONSE_BYTES} bytes")
        head, separator, body = bytes(response).partition(b"\r\n\r\n")
        status = head.split(b"\r\n", 1)[0].split()
        if not separator or len(status) < 2 or status[1] != b"200":
            return None
        return body.decode("utf-8", "replace")


class MetricsBusynessReader:
    """The in-flight gauge of a worker pod, with its throughput counters."""

    def __init__(self, metrics: WorkerMetrics | None = None, **options: Any) -> None:
        #: shared with the pool-child death reader: one request per pod and poll serves both
        self.metrics = metrics or WorkerMetrics(**options)

    async def __call__(self, pod: Mapping[str, Any]) -> PodReading | None:
        text = await self.metrics.text(pod)
        return None if text is None else parse_reading(text)


async def read_busyness(pods: list[Mapping[str, Any]], reader: BusynessReader) -> list[PodBusyness]:
    """Every pod's busyness, read concurrently."""
    async def one(pod: Mapping[str, Any]) -> PodBusyness:
        name = pod["metadata"]["name"]
        if not pod_is_running(pod):
            return PodBusyness(name, 0, running=False)
        reading = await reader(pod)
        if reading is None:
            return PodBusyness(name, None)
        return PodBusyness(name, reading.in_flight, completed=reading.completed,
                           busy_seconds=reading.busy_seconds, slots=reading.slots)
    return list(await asyncio.gather(*(one(p) for p in pods)))
