"""Idempotency: run an effect at most once per key, whatever the number of deliveries.

Two stores, one shape. A guard yields a `Claim`: when `claim.done` the effect already happened
and `claim.result` is what it returned; otherwise the body runs the effect and (optionally) calls
`claim.set_result(value)`.

    store = RedisStore(client=redis.Redis.from_url(url))

    @app.task(bind=True)
    @idempotent(store, key=lambda task, order_id: f"charge:{order_id}")
    def charge(task, order_id): ...

    with PostgresStore().guard(f"ship:{order_id}", conn=conn) as claim:
        if not claim.done:
            conn.execute("insert into shipments ...")   # same transaction as the key row

What each store guarantees, and where it does not, is in docs/effects.md.
"""
from .claim import Claim, InProgress, InvalidKey, LeaseLost, StoreUnavailable, validate_key
from .decorator import idempotent
from .postgres_store import PostgresStore
from .redis_store import RedisStore

__all__ = ["Claim", "InProgress", "InvalidKey", "LeaseLost", "PostgresStore", "RedisStore", "StoreUnavailable",
           "idempotent", "validate_key"]
