"""`@idempotent(store, key=...)`: the guard around a whole function."""
from __future__ import annotations

import functools
import inspect
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
        _refuse_a_celery_task(fn)
        _check_takes_the_arguments_of(fn, "key", key)
        if is_postgres:
            _check_takes_the_arguments_of(fn, "connection", connection)

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


def _refuse_a_celery_task(fn: object) -> None:
    """Above `@app.task` the decorator would wrap the task object: Celery would run the registered,
    unguarded function for every delivery, and the module's name would lose `.delay`."""
    try:
        from celery import Task
        from celery.local import Proxy
    except ImportError:  # no Celery, so no Celery task
        return
    # type(), not isinstance(): `@app.task` (and `@shared_task`) return a lazy Proxy of the task, which
    # isinstance() would evaluate (finalizing the app at import). Celery's proxies stand for tasks,
    # the app and the current task: none of them is a function to guard.
    kind = type(fn)
    if not issubclass(kind, (Task, Proxy)):
        return
    name = getattr(fn, "name", None) if issubclass(kind, Task) else None
    raise TypeError(f"idempotent(...) got a Celery task{f' {name!r}' if name else ''}, not a function: placed "
                    "above @app.task it would leave the task Celery runs unguarded (every delivery runs the "
                    "effect); valid: put @idempotent under @app.task, on the function itself — "
                    "@app.task(bind=True) then @idempotent(store, key=...) then def ...")


#: stands for every argument the decorator may pass on
_ANY = object()
#: a keyword no parameter has: only a **kwargs takes it, as it takes what the task's **kwargs receives
_OTHER_KEYWORD = "taskherd any other keyword"


def _calls(fn: Callable) -> list[tuple[list[str], list[str]]] | None:
    """The calls the decorator may pass on, as (positional, keyword) argument names: the required
    arguments alone; all of them, positionally, plus one for `*args` and one for `**kwargs`; and all
    but the first by name (`charge.delay(order_id=5)`; Celery passes a bound task's `task` first).
    None when the function has no signature to read (a builtin)."""
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    kind = inspect.Parameter
    positional = [p for p in parameters if p.kind in (kind.POSITIONAL_ONLY, kind.POSITIONAL_OR_KEYWORD)]
    keyword = [p.name for p in parameters if p.kind is kind.KEYWORD_ONLY]
    required = [p.name for p in positional if p.default is p.empty]
    required_keyword = [p.name for p in parameters if p.kind is kind.KEYWORD_ONLY and p.default is p.empty]
    var_positional = [f"*{p.name}" for p in parameters if p.kind is kind.VAR_POSITIONAL]
    var_keyword = [f"**{p.name}" for p in parameters if p.kind is kind.VAR_KEYWORD]
    calls = [(required, required_keyword), ([p.name for p in positional] + var_positional, keyword + var_keyword)]
    by_name = [p.name for p in positional[1:] if p.kind is kind.POSITIONAL_OR_KEYWORD]
    if by_name:
        calls.append(([p.name for p in positional[:len(positional) - len(by_name)]], by_name + keyword))
    return calls


def _check_takes_the_arguments_of(fn: Callable, role: str, function: Callable) -> None:
    """`key` and `connection` are called with the decorated function's own arguments: one that cannot
    take them fails here, at import, rather than in every run of the task (dead-lettered)."""
    calls = _calls(fn)
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return
    for positional, keyword in calls or ():
        names = {(_OTHER_KEYWORD if name.startswith("**") else name): _ANY for name in keyword}
        try:
            signature.bind(*[_ANY] * len(positional), **names)
        except TypeError as exc:
            var_keyword = next((name for name in keyword if name.startswith("**")), "**kwargs")
            reason = str(exc).replace(repr(_OTHER_KEYWORD), f"(any keyword the task's {var_keyword} receives)")
            call = ", ".join([*positional, *(name if name.startswith("**") else f"{name}=…" for name in keyword)])
            name = getattr(function, "__qualname__", type(function).__name__)
            raise TypeError(
                f"idempotent {role}={name}{signature} cannot take the arguments of the task "
                f"{fn.__qualname__}{inspect.signature(fn)}, which the decorator calls it with — "
                f"{role}({call}): {reason}; valid: a function of the same parameters, e.g. "
                f"{role}=lambda {_example_parameters(fn)}: … (or lambda task, *args, **kwargs: …)") from None


def _example_parameters(fn: Callable) -> str:
    """The function's parameters as a lambda can write them (no annotations, no defaults)."""
    signature = inspect.signature(fn)
    empty = inspect.Parameter.empty
    bare = [p.replace(annotation=empty, default=empty) for p in signature.parameters.values()]
    return str(signature.replace(parameters=bare, return_annotation=empty))[1:-1]
