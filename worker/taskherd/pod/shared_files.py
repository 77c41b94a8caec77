"""The files a worker shares with the commands of its pod: heartbeat.json and drain-request.json.

Import-light on purpose (standard library only, no Celery): the probe runs in every pod every few
seconds and imports this module.

The worker's main loop writes ``heartbeat.json`` in the heartbeat directory (an emptyDir in
Kubernetes) every ``interval_seconds``; readers never talk to the worker or the broker. The drain
command asks the worker to drain by writing ``drain-request.json`` in the same directory.
Both files are replaced atomically (temporary file + rename), so a reader sees the old or the new
record, never half of one.
"""
import os

try:  # CPython's JSON scanner without the `json` package: `json` imports `re`, which costs the probe
    import _json  # ~10 ms of CPU per run (python -X importtime); the worker side may use `json` freely.
except ImportError:  # pragma: no cover - other interpreters
    _json = None

from taskherd import contract

#: Environment variable naming the heartbeat directory (the chart mounts an emptyDir there).
DIR_ENV = "TASKHERD_HEARTBEAT_DIR"
#: Used when the variable is unset.
DEFAULT_DIR = contract.BY_NAME[DIR_ENV].default
HEARTBEAT_FILE = "heartbeat.json"
DRAIN_REQUEST_FILE = "drain-request.json"
#: Bumped when a field changes meaning; readers refuse a format they do not know.
FORMAT = 1


def heartbeat_dir(directory: str | None = None) -> str:
    """The directory given, else $TASKHERD_HEARTBEAT_DIR, else the default."""
    return directory or contract.read_one(DIR_ENV)


def heartbeat_path(directory: str | None = None) -> str:
    return os.path.join(heartbeat_dir(directory), HEARTBEAT_FILE)


def drain_request_path(directory: str | None = None) -> str:
    return os.path.join(heartbeat_dir(directory), DRAIN_REQUEST_FILE)


class _ScannerContext:
    """The settings `_json.make_scanner` reads (those of `json.JSONDecoder()`)."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = None
    memo = None


_scan = _json.make_scanner(_ScannerContext()) if _json is not None else None


def loads(text: str) -> object:
    """json.loads for well-formed records, without importing `json` (see the import above)."""
    if _scan is not None:
        try:
            value, end = _scan(text, 0)
        except Exception:  # noqa: BLE001 - malformed: let `json` produce the real error message
            pass
        else:
            if not text[end:].strip():
                return value
    import json

    return json.loads(text)


_writes = 0


def write_json_atomically(path: str, record: dict[str, object]) -> None:
    """Writes `record` to `path` through a temporary file and a rename (atomic on POSIX)."""
    import json

    global _writes
    _writes += 1
    # Unique per write: a signal handler writing in the middle of another write must not share
    # (and truncate) its temporary file.
    temporary = f"{path}.{os.getpid()}.{_writes}.tmp"
    with open(temporary, "w") as handle:
        json.dump(record, handle, separators=(",", ":"))
    # No fsync: the directory is a tmpfs/emptyDir and a reader only needs rename atomicity.
    os.replace(temporary, path)


def read_json(path: str) -> dict[str, object] | None:
    """The record at `path`, or None when the file does not exist.

    Raises ValueError naming the path when the file exists but is not a JSON object.
    """
    try:
        with open(path) as handle:
            text = handle.read()
    except FileNotFoundError:
        return None
    try:
        record = loads(text)
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        raise ValueError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(record, dict):
        raise ValueError(f"{path} holds a {type(record).__name__}, expected a JSON object")
    return record


def remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
