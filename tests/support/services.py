"""Per-test isolation on the shared loopback services."""
from __future__ import annotations

import contextlib
import time
import uuid
from urllib.parse import quote, urlsplit, urlunsplit

import httpx
import psycopg
import redis

LEASE_SECONDS = 900


@contextlib.contextmanager
def leased_redis_db(base_url: str, first: int = 1, last: int = 15, wait_seconds: float = 120):
    """Leases one Redis database index (1-15) through a SET NX key in db 0, flushes it, yields its URL.

    Kombu keeps its `unacked` bookkeeping in fixed keys per database, so two tests sharing a
    database would restore each other's messages: a whole database per test avoids that.
    """
    parts = urlsplit(base_url)
    control = redis.Redis.from_url(urlunsplit(parts._replace(path="/0")))
    token = uuid.uuid4().hex
    deadline = time.monotonic() + wait_seconds
    while True:
        for index in range(first, last + 1):
            if control.set(f"taskherd-test:db-lease:{index}", token, nx=True, ex=LEASE_SECONDS):
                url = urlunsplit(parts._replace(path=f"/{index}"))
                redis.Redis.from_url(url).flushdb()
                try:
                    yield url
                finally:
                    if control.get(f"taskherd-test:db-lease:{index}") == token.encode():
                        control.delete(f"taskherd-test:db-lease:{index}")
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"no free Redis database index in {first}..{last} after {wait_seconds}s")
        time.sleep(0.5)


@contextlib.contextmanager
def fresh_vhost(amqp_url: str, api_url: str):
    """Creates a RabbitMQ vhost for one test, yields an AMQP URL on it, deletes it afterwards."""
    api = urlsplit(api_url)
    client = httpx.Client(base_url=urlunsplit(api._replace(netloc=api.hostname + f":{api.port}")),
                          auth=(api.username, api.password), timeout=30)
    amqp = urlsplit(amqp_url)
    vhost = f"t-{uuid.uuid4().hex[:12]}"
    client.put(f"/api/vhosts/{vhost}").raise_for_status()
    client.put(f"/api/permissions/{vhost}/{amqp.username}",
               json={"configure": ".*", "write": ".*", "read": ".*"}).raise_for_status()
    try:
        yield urlunsplit(amqp._replace(path="/" + quote(vhost, safe="")))
    finally:
        client.delete(f"/api/vhosts/{vhost}")
        client.close()


@contextlib.contextmanager
def fresh_database(dsn: str):
    """Creates a PostgreSQL database for one test, yields its DSN, drops it afterwards."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    parts = urlsplit(dsn)
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(parts._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
