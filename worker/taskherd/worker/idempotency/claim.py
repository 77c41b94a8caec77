"""What a guard hands to its body, and the errors both stores raise."""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any

from .. import celery_json
from ..transient import TransientError

#: Keys are stored verbatim (Redis key suffix, PostgreSQL text primary key); this bound keeps
#: them index-friendly and catches a key function that serialises a whole payload by mistake.
MAX_KEY_LENGTH = 512


class InvalidKey(ValueError):
    """The key function returned something that cannot be a key."""


class InProgress(TransientError):
    """Another holder is running the effect for this key right now (Redis store).

    Transient, so a taskherd task retries it with backoff like any other transient error: the
    holder either finishes (the retry then returns its stored result) or dies and its lease
    expires (the retry then takes the key over). `retry_after` is the lease time left, in
    seconds, for callers that schedule their own retry.
    """

    def __init__(self, key: str, *, retry_after: float, holder: str | None = None, reason: str | None = None):
        self.key = key
        self.retry_after = retry_after
        self.holder = holder
        super().__init__(f"idempotency key {key!r} is in progress ({reason})" if reason else
                         f"idempotency key {key!r} is in progress (holder {holder or 'unknown'}, "
                         f"lease expires in {retry_after:.1f}s): retry after the lease")


class StoreUnavailable(TransientError):
    """The idempotency store could not be reached before the effect ran: nothing ran, retry later."""

    def __init__(self, key: str, *, cause: BaseException):
        self.key = key
        super().__init__(f"idempotency key {key!r}: the store is unreachable ({cause!r}); "
                         "the effect did not run: retry later")


class LeaseLost(Exception):
    """The holder's lease expired while its body ran, and the key may have been taken over.

    The effect may therefore have run twice: the lease was too short for a pause of this holder
    (renewal could not run). Raised at the end of the guard, after the body.
    """

    def __init__(self, key: str, *, lease_seconds: float):
        self.key = key
        self.lease_seconds = lease_seconds
        super().__init__(f"idempotency key {key!r}: lease of {lease_seconds}s was lost while the effect ran "
                         "(the holder was paused longer than the lease); the effect may have run twice")


@dataclass
class Claim:
    """`done` means the effect already happened for `key`; `result` is what it returned."""

    key: str
    done: bool
    result: Any = None
    _result_set: bool = field(default=False, repr=False)
    #: set by the store when its guard has ended: the result is stored (or not) by then
    _finished: bool = field(default=False, repr=False)

    def set_result(self, value: Any) -> None:
        """Records what the effect returned; duplicates get it back as Celery's JSON serializer would
        (`celery_json`: a datetime stays a datetime). A value it cannot encode is refused by the store
        at the end of the guard (`unstorable_result`). Called more than once in the guard, the last
        value is the one stored. After the guard has ended it raises RuntimeError: the store wrote
        the result when the guard ended, and a later value would be lost without a word."""
        self._check_open("set_result")
        self.result = value
        self._result_set = True

    def _check_open(self, method: str) -> None:
        if self.done:
            raise RuntimeError(f"idempotency key {self.key!r} is already done: its effect must not run again")
        if self._finished:
            raise RuntimeError(f"idempotency key {self.key!r}: claim.{method}(...) after the guard ended; the "
                               "guard stored the result it had when it ended; valid: call it inside the "
                               "`with store.guard(...) as claim:` block")


def unstorable_result(key: str, store: str, result: Any, error: Exception, consequence: str) -> TypeError:
    """The error for a result the store cannot keep: the key, the store, the type, why, what happened."""
    return TypeError(f"idempotency key {key!r} ({store}): the result, a {type(result).__name__}, cannot be stored "
                     f"({error}); valid: {celery_json.VALID}; {consequence}")


def validate_key(key: object) -> str:
    if not isinstance(key, str) or not key:
        raise InvalidKey(f"idempotency key must be a str of 1..{MAX_KEY_LENGTH} characters, "
                         f"got {key!r} ({type(key).__name__})")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidKey(f"idempotency key {key[:40]!r}… is {len(key)} characters long; "
                         f"valid: 1..{MAX_KEY_LENGTH} (hash long natural keys)")
    try:
        key.encode("utf-8")
    except UnicodeEncodeError as exc:
        # repr() shows a surrogate as an escape: the message itself stays encodable (logs, brokers).
        raise InvalidKey(f"idempotency key {key[:40]!r}{'…' if len(key) > 40 else ''} holds the surrogate code "
                         f"point \\u{ord(key[exc.start]):04x} at {exc.start}, which is not Unicode text and no "
                         f"store can keep; valid: a str of 1..{MAX_KEY_LENGTH} Unicode characters (encodable "
                         "as UTF-8; decode bytes without errors='surrogateescape', or hex/base64 them)") from None
    return key


def validate_seconds(owner: str, name: str, value: object, minimum: float, maximum: float = math.inf) -> float:
    """`value` as a float, or an error naming `name` as the user wrote it and the valid range: raised
    where the setting is given, not later inside a task (where it would be dead-lettered)."""
    valid = f"a number >= {minimum}" + (f" and <= {maximum:g}" if maximum < math.inf else " (finite)")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{owner} {name}={value!r} ({type(value).__name__}); valid: {valid}")
    try:
        seconds = float(value)
    except OverflowError:  # an int beyond any float
        seconds = math.inf
    if not (math.isfinite(seconds) and minimum <= seconds <= maximum):
        raise ValueError(f"{owner} {name}={value!r}; valid: {valid}")
    return seconds
