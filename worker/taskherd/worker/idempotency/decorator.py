"""`@idempotent(store, key=...)`: the guard around a whole function."""
from __future__ import annotations

import functools
from typing import Any, Callable

from .claim import validate_seconds
from .postgres_store import PostgresStore


def idempotent(
    store,
    *,
    key: Callable[..., str],
    connection: Callable[..., Any] | None = None,
    wait_seconds: float = 0.0,
) -> Callable:
    """Runs the function at most once per `key(*args, **kwargs)`; duplicates return its stored result.

    `key` receives the function's own arguments (for a bound Celery task, the task first: use
    `task.request.id` to make a message's redeliveries one key). With a `PostgresStore`,
    `connection(*args, **kwargs)` returns the psycopg connection the function's effect uses, so
    that the key row and the effect commit together. `wait_seconds` (Redis store) waits for a busy
    key before raising `InProgress`.

    Put it under `@app.task`, so that Celery registers the guarded function.
    """
    # Every mistake here is refused now, where it was written, not in each call of the task.
    if not callable(getattr(store, "guard", None)):
        raise TypeError(f"idempotent store= got a {type(store).__name__}; valid: a RedisStore or a PostgresStore")
    if not callable(key):
        raise TypeError(f"idempotent key={key!r}; valid: a function of the task's arguments returning the key "
                        "(a str), e.g. key=lambda task, order_id: f\"charge:{order_id}\"")
    is_postgres = isinstance(store, PostgresStore)
    if is_postgres and connection is None:
        raise TypeError("idempotent(PostgresStore) needs connection=: a function of the task's arguments "
                        "returning the psycopg connection its effect uses")
    if is_postgres and not callable(connection):
        raise TypeError(f"idempotent connection= got a {type(connection).__name__}; valid: a function of the "
                        "task's arguments returning the psycopg connection its effect uses")
    if not is_postgres and connection is not None:
        raise TypeError(f"idempotent({type(store).__name__}) takes no connection=; only PostgresStore does")
    wait_seconds = validate_seconds("idempotent", "wait_seconds", wait_seconds, 0)
    if is_postgres and wait_seconds:
        raise TypeError("idempotent(PostgresStore) takes no wait_seconds=; only RedisStore does "
                        "(a PostgreSQL duplicate waits for the holder's transaction)")

    def decorate(fn: Callable) -> Callable:
        if not callable(fn):
            raise TypeError(f"idempotent(...) decorates a function, got {fn!r}")

        @functools.wraps(fn)
        def guarded(*args, **kwargs):
            k = key(*args, **kwargs)
            if is_postgres:
                guard = store.guard(k, conn=connection(*args, **kwargs))
            else:
                guard = store.guard(k, wait_seconds=wait_seconds)
            with guard as claim:
                if claim.done:
                    return claim.result
                result = fn(*args, **kwargs)
                claim.set_result(result)
                return result

        return guarded

    return decorate
