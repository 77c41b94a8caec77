"""Which exceptions are worth retrying: transient (network, timeouts, 429/5xx) vs permanent.

Decided from the exception alone, without importing any HTTP client: a client that is not
installed cannot have raised the exception, and importing one just to ``isinstance`` against it
would make every worker pay for every client. HTTP errors are recognised by the module of their
class (``requests``, ``httpx``, ``urllib3``, ``aiohttp``) and their status code; database and cache
drivers' connection errors (psycopg, psycopg2, redis) by module and class name.
"""
from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Iterable


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
#: ConnectionError is not the builtin one, so the builtin check alone would miss it.
_DRIVER_TRANSIENT = frozenset({
    ("psycopg", "OperationalError"), ("psycopg2", "OperationalError"),
    ("redis", "ConnectionError"), ("redis", "TimeoutError"), ("redis", "BusyLoadingError"),
})


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
        if isinstance(exc, self.permanent):
            return False
        if self.detect_http_clients and is_http_client_error(exc):
            # A 4xx other than 408/425/429 is the request's fault even though the client's
            # HTTPError may subclass an IOError-like base: decide on the status first.
            return _is_transient_http(exc)
        return isinstance(exc, self.transient) or _is_transient_driver_error(exc)


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
