"""The Redis store's record format and the pure decision taken on it.

A key holds one JSON record: ``{"state": "in_progress", "holder", "token"}`` with a TTL equal to
the lease, or ``{"state": "done", "result", "holder"}`` with a TTL equal to the result TTL. The
result is written as Celery's JSON serializer writes it (`celery_json`), so a duplicate returns
a datetime, a Decimal, bytes… as Celery would have. The
lease is Redis's own key expiry, so no client clock is ever compared with another's: a holder
that stops renewing simply loses its key.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from enum import Enum
from typing import Any

from .. import celery_json

IN_PROGRESS = "in_progress"
DONE = "done"


class Action(Enum):
    RUN = "run"            # the key was free and is now ours
    RETURN = "return"      # done: hand back the stored result, do not run
    BUSY = "busy"          # another live holder has it


@dataclass(frozen=True)
class Decision:
    action: Action
    result: Any = None
    holder: str | None = None
    retry_after: float = 0.0


#: One for every claim that won: building a frozen dataclass costs more than the rest of decide().
_RUN = Decision(Action.RUN)


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


def new_token() -> str:
    return os.urandom(16).hex()  # a uuid4's randomness without building a UUID (per task)


_json_string = json.encoder.encode_basestring_ascii  # what json.dumps writes for a str (ensure_ascii)


def _json_value(value: Any) -> str:
    # Plain JSON values come out as json.dumps writes them; kombu's typed values as kombu does.
    return "null" if value is None else celery_json.dumps(value)


def in_progress_record(holder: str, token: str | None = None) -> str:
    # The token makes every claim's record unique, so compare-and-set scripts recognise their own.
    # Written as json.dumps writes the dict {"state", "holder", "token"}, without its encoder (per task).
    token = _json_string(token or new_token())
    return f'{{"state": "{IN_PROGRESS}", "holder": {_json_string(holder)}, "token": {token}}}'


def done_record(holder: str, result: Any, token: str | None = None) -> str:
    """Raises TypeError or ValueError when Celery's JSON serializer cannot encode `result`."""
    # With the claim's token, a holder whose reply was lost recognises the done record as its own.
    # As json.dumps writes {"state", "holder", "result"[, "token"]}: only the result goes through it.
    record = f'{{"state": "{DONE}", "holder": {_json_string(holder)}, "result": {_json_value(result)}'
    return f'{record}, "token": {_json_string(token)}}}' if token else record + "}"


def decide(claimed: bool, raw: bytes | str | None, pttl_ms: int, *, own_record: str | None = None) -> Decision:
    """What to do after the claim script: `claimed` if SET NX won, else the existing record.

    `own_record` is the record this claim tried to set: finding it means an earlier try of this
    same claim won and only its reply was lost (the claim is re-sent after a dropped connection).
    """
    if claimed or (raw is not None and own_record is not None and _text(raw) == own_record):
        return _RUN
    if raw is None:  # expired between calls; the caller simply tries again
        return Decision(Action.BUSY, retry_after=0.0)
    record = celery_json.loads(raw)
    state = record.get("state")
    if state == DONE:
        return Decision(Action.RETURN, result=record.get("result"), holder=record.get("holder"))
    if state == IN_PROGRESS:
        return Decision(Action.BUSY, holder=record.get("holder"), retry_after=max(pttl_ms, 0) / 1000)
    raise ValueError(f"idempotency record has state {state!r}; valid: {IN_PROGRESS!r}, {DONE!r} "
                     f"(record: {raw!r})")
