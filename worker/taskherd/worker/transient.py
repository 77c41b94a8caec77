"""Which exceptions are worth retrying: transient (network, timeouts, 429/5xx) vs permanent.

Decided from the exception alone, without importing any HTTP client: a client that is not
installed cannot have raised the exception, and importing one just to ``isinstance`` against it
would make every worker pay for every client. HTTP errors are recognised by the module of their
class (``requests``, ``httpx``, ``urllib3``, ``aiohttp``) and their status code; database and cache
drivers' connection errors (psycopg, psycopg2, redis) by module and class name.

A wrapped error is judged by what it wraps: ORMs re-raise a driver's error as their own
(Django's ``OperationalError`` ``from`` psycopg's, SQLAlchemy's with the driver's in ``.orig``),
so an exception that is neither transient nor permanent itself is decided by its ``__cause__``
(``raise … from …``) or ``.orig``, recursively. ``__context__`` alone (an error raised while
handling another) is not followed: that is a new failure, often the code's own verdict on the
first one ("upstream unreachable" turned into "invalid order").
"""
from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Iterable, Iterator


class TransientError(Exception):
    """Raise (or subclass) to say: this failure may pass, retry with backoff."""


class PermanentError(Exception):
    """Raise (or subclass) to say: retrying cannot help, dead-letter now (validation and the like)."""


#: Standard-library failures of the network or of a deadline. OSError as a whole is NOT here:
#: FileNotFoundError and PermissionError are OSErrors that no retry will fix.
DEFAULT_TRANSIENT: tuple[type[BaseException], ...] = (
    TransientError,
    ConnectionError,  # ConnectionRefused/Reset/Aborted, BrokenPipe
    TimeoutError,  # socket.timeout is an alias since 3.10
    socket.gaierror,  # DNS hiccups
    InterruptedError,
)

#: Never retried, whatever else matches: the marker, and errors that describe the input.
DEFAULT_PERMANENT: tuple[type[BaseException], ...] = (PermanentError,)

#: HTTP statuses that say "try again later".
RETRYABLE_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})

#: Root modules of HTTP clients whose network/timeout exceptions are transient by nature.
_HTTP_CLIENT_MODULES = ("requests", "httpx", "urllib3", "aiohttp")
#: Class names (anywhere in the MRO) of those clients' connection and timeout errors.
_HTTP_TRANSIENT_NAMES = frozenset({
    # requests
    "ConnectionError", "Timeout", "ConnectTimeout", "ReadTimeout", "ChunkedEncodingError",
    # httpx
    "TransportError", "TimeoutException", "NetworkError", "RemoteProtocolError", "PoolTimeout",
    # urllib3
    "NewConnectionError", "ProtocolError", "TimeoutError", "ReadTimeoutError",
    "ConnectTimeoutError", "MaxRetryError",
    # aiohttp
    "ClientConnectionError", "ServerTimeoutError", "ServerDisconnectedError",
    "ClientConnectorError", "ClientPayloadError",
})


#: Database and cache clients' errors that pass by themselves, by (root module, class name) anywhere
#: in the MRO: a dropped connection, a server restarting, a deadlock or serialization failure
#: (psycopg's DeadlockDetected and SerializationFailure are OperationalErrors). redis-py's
#: ConnectionError is not the builtin one, so the builtin check alone would miss it; a replica
#: promoted during a failover answers writes with READONLY (ReadOnlyError) or MASTERDOWN until
#: the clients follow the new primary, and a cluster resharding answers TRYAGAIN / CLUSTERDOWN.
_DRIVER_TRANSIENT = frozenset({
    ("psycopg", "OperationalError"), ("psycopg2", "OperationalError"),
    ("redis", "ConnectionError"), ("redis", "TimeoutError"), ("redis", "BusyLoadingError"),
    ("redis", "ReadOnlyError"), ("redis", "MasterDownError"), ("redis", "TryAgainError"),
    ("redis", "ClusterDownError"),
})

#: How deep a chain of wrapped exceptions is followed (a cycle or a pathological chain stops here).
MAX_WRAPPING_DEPTH = 8


def _is_transient_driver_error(exc: BaseException) -> bool:
    return any((_root_module(cls), cls.__name__) in _DRIVER_TRANSIENT for cls in type(exc).__mro__)


def _root_module(cls: type) -> str:
    return (getattr(cls, "__module__", "") or "").split(".", 1)[0]


def http_status(exc: BaseException) -> int | None:
    """The HTTP status carried by a client's error, if any (``.response.status_code``, ``.status``)."""
    response = _safe_getattr(exc, "response")
    for holder, attr in ((response, "status_code"), (response, "status"), (exc, "status"), (exc, "status_code")):
        value = _safe_getattr(holder, attr) if holder is not None else None
        if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599:
            return value
    return None


def _safe_getattr(obj: object, name: str) -> object:
    # Some clients expose these as properties that raise when unset (httpx's `.request`).
    try:
        return getattr(obj, name, None)
    except Exception:  # noqa: BLE001 - a broken property means "no status", not a crash
        return None


def is_http_client_error(exc: BaseException) -> bool:
    return any(_root_module(cls) in _HTTP_CLIENT_MODULES for cls in type(exc).__mro__)


def _is_transient_http(exc: BaseException) -> bool:
    if not is_http_client_error(exc):
        return False
    status = http_status(exc)
    if status is not None:
        return status in RETRYABLE_STATUSES
    return any(cls.__name__ in _HTTP_TRANSIENT_NAMES and _root_module(cls) in _HTTP_CLIENT_MODULES
               for cls in type(exc).__mro__)


@dataclass(frozen=True, kw_only=True)
class ErrorClassifier:
    """``is_transient(exc)``: retry it? Permanent classes win over transient ones."""

    #: classes retried with backoff (in addition to HTTP 429/5xx and client network errors)
    transient: tuple[type[BaseException], ...] = DEFAULT_TRANSIENT
    #: classes never retried, checked first
    permanent: tuple[type[BaseException], ...] = DEFAULT_PERMANENT
    #: recognise requests/httpx/urllib3/aiohttp errors by module, name and status
    detect_http_clients: bool = True

    def is_transient(self, exc: BaseException) -> bool:
        for error in wrapping_chain(exc):
            verdict = self._verdict(error)
            if verdict is not None:
                return verdict
        return False

    def _verdict(self, exc: BaseException) -> bool | None:
        """True/False when ``exc`` itself decides; None when only what it wraps can."""
        if isinstance(exc, self.permanent):
            return False
        if self.detect_http_clients and is_http_client_error(exc):
            # A 4xx other than 408/425/429 is the request's fault even though the client's
            # HTTPError may subclass an IOError-like base: decide on the status first.
            return _is_transient_http(exc)
        if isinstance(exc, self.transient) or _is_transient_driver_error(exc):
            return True
        return None


def retry_after(exc: BaseException) -> float | None:
    """Seconds before a retry can succeed, when the error says so (``retry_after``, e.g.
    :class:`taskherd.worker.idempotency.InProgress`: the lease time left), on it or on what it wraps."""
    for error in wrapping_chain(exc):
        value = _safe_getattr(error, "retry_after")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
            return float(value)
    return None


def wrapping_chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then what it wraps, and so on (at most MAX_WRAPPING_DEPTH, never a cycle)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < MAX_WRAPPING_DEPTH:
        seen.add(id(current))
        yield current
        current = wrapped(current)


def wrapped(exc: BaseException) -> BaseException | None:
    """The exception ``exc`` wraps: its ``__cause__`` (``raise … from …``), else SQLAlchemy's ``.orig``."""
    if exc.__cause__ is not None:
        return exc.__cause__
    orig = _safe_getattr(exc, "orig")
    return orig if isinstance(orig, BaseException) else None


def make_classifier(*, transient: Iterable[type[BaseException]] = (),
                    permanent: Iterable[type[BaseException]] = (),
                    replace_defaults: bool = False,
                    detect_http_clients: bool = True) -> ErrorClassifier:
    """A classifier with ``transient``/``permanent`` added to the defaults (or replacing them)."""
    transient, permanent = tuple(transient), tuple(permanent)
    for name, classes in (("transient_errors", transient), ("permanent_errors", permanent)):
        for cls in classes:
            if not (isinstance(cls, type) and issubclass(cls, BaseException)):
                raise TypeError(f"{name} must contain exception classes, got {cls!r}")
    if not replace_defaults:
        transient, permanent = DEFAULT_TRANSIENT + transient, DEFAULT_PERMANENT + permanent
    return ErrorClassifier(transient=transient, permanent=permanent, detect_http_clients=detect_http_clients)
