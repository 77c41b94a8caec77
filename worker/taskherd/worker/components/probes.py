"""HTTP probes served by the worker: the kubelet's ``httpGet`` instead of a process forked per probe.

``GET /livez``, ``/readyz`` and ``/startupz`` on the worker's metrics port (the Metrics component's
server, taskherd.contract.WORKER_METRICS_PORT) answer ``200`` or ``503`` with the same one-line
reason as ``taskherd probe``, judged by the same pure rules (taskherd.pod.probe.judge) on the same
record: heartbeat.json, which the worker's event loop writes. Query parameters mirror the exec
probe's flags: ``?max-age=SECONDS`` (staleness threshold) and ``?task-margin=SECONDS`` (liveness).

Why an answer from a thread of the worker's own main process is still an honest liveness check:
the thread judges the record the event loop writes, never its own health.

- the event loop wedged (a blocking call without timeout, a deadlock): the record goes stale, 503;
- a task past its hard limit + margin (the pool failed to kill it): 503;
- the whole process stopped (SIGSTOP) or spinning in C code holding the GIL: no answer at all, and
  the kubelet counts a probe timeout as a failure;
- a broker outage: readiness 503 (``broker disconnected for 12s``), liveness 200 — restarting every
  worker of a cluster during a broker blip helps nobody.

The cost per probe is one HTTP request to a thread that reads one small file: no interpreter
start, no imports (bench/probe_cost.py measures it beside the exec probe and ``celery inspect ping``).
"""
from __future__ import annotations

import socket
import threading
import time
from socketserver import ThreadingMixIn
from typing import Any, Callable, Iterable
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from taskherd.pod import flags, probe, shared_files

#: path -> probe kind
PATHS = {"/livez": "liveness", "/readyz": "readiness", "/startupz": "startup"}
#: query parameter -> keyword of taskherd.pod.probe.judge (the exec probe's flags, same spelling)
PARAMETERS = {"max-age": "max_age", "task-margin": "task_margin"}


def answer(kind: str, record: dict[str, object] | None, *, now: float, max_age: float | None = None,
           task_margin: float = probe.DEFAULT_TASK_MARGIN, source: str = "heartbeat") -> tuple[int, str]:
    """(HTTP status, one-line body) of probe `kind` on `record`: pure, tested without a server."""
    verdict = probe.judge(kind, record, now=now, max_age=max_age, task_margin=task_margin, source=source)
    return (200 if verdict.ok else 503), f"{kind} {'ok' if verdict.ok else 'failed'}: {verdict.reason}\n"


def options(query: str) -> dict[str, float]:
    """Keywords for :func:`answer` from a query string; raises ValueError naming a bad parameter."""
    parsed: dict[str, float] = {}
    for name, values in parse_qs(query, keep_blank_values=True).items():
        if name not in PARAMETERS:
            raise ValueError(f"unknown parameter {name!r} (valid: {', '.join(PARAMETERS)})")
        parsed[PARAMETERS[name]] = flags.seconds(f"parameter {name}", values[-1], zero_allowed=name == "task-margin")
    return parsed


_REASONS = {200: "200 OK", 400: "400 Bad Request", 503: "503 Service Unavailable"}


class ProbeEndpoints:
    """WSGI app answering the probe paths and passing every other request to ``app`` (/metrics)."""

    def __init__(self, app: Callable, *, heartbeat_path: str, clock: Callable[[], float] = time.time):
        self.app, self.heartbeat_path, self.clock = app, heartbeat_path, clock

    def __call__(self, environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        kind = PATHS.get(environ.get("PATH_INFO", ""))
        if kind is None:
            return self.app(environ, start_response)
        try:
            keywords = options(environ.get("QUERY_STRING", ""))
        except ValueError as exc:
            return self._respond(start_response, 400, f"{kind}: {exc}\n")
        try:
            record = shared_files.read_json(self.heartbeat_path)
        except (OSError, ValueError) as exc:
            return self._respond(start_response, 503, f"{kind} failed: cannot read heartbeat: {exc}\n")
        status, body = answer(kind, record, now=self.clock(), source=self.heartbeat_path, **keywords)
        return self._respond(start_response, status, body)

    @staticmethod
    def _respond(start_response: Callable, status: int, body: str) -> list[bytes]:
        data = body.encode()
        start_response(_REASONS[status], [("Content-Type", "text/plain; charset=utf-8"),
                                          ("Content-Length", str(len(data)))])
        return [data]


class _QuietHandler(WSGIRequestHandler):
    """No access log: the kubelet probes every second or so."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a probe in flight never holds up the worker's exit


def serve(app: Callable, *, port: int, address: str) -> WSGIServer:
    """Serves `app` on address:port from a daemon thread; returns the server (``shutdown()`` stops it)."""

    class Server(_ThreadingServer):
        address_family = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM,
                                            flags=socket.AI_PASSIVE)[0][0]

    server = make_server(address, port, app, Server, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="taskherd-http", daemon=True).start()
    return server
