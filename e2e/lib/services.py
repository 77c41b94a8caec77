"""The loopback services of ``scripts/services.sh`` as the tests, the benchmarks and the demo use them.

- :func:`settings`: their ports and credentials, read from ``scripts/services.env`` (the one
  definition, also sourced by services.sh) with the same environment overrides services.sh honours.
- Isolation on the shared instances, so that runs never see each other's data: a Redis database
  index leased through a ``SET NX`` key in database 0 (:func:`leased_redis_db` for one test,
  :func:`hold_redis_db` / :func:`release_redis_db` for a long-lived holder such as the demo), a fresh
  RabbitMQ vhost (:func:`fresh_vhost`), a fresh PostgreSQL database (:func:`fresh_database`).
- :func:`free_port`: a loopback port for a server a test or benchmark starts itself.
"""
from __future__ import annotations

import contextlib
import os
import socket
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

from .envfile import read_env_file
from .waiting import wait_for

SERVICES_ENV = Path(__file__).resolve().parents[2] / "scripts" / "services.env"

#: The key in Redis database 0 that leases database `index` (1-15) to one holder.
LEASE_KEY = "taskherd-test:db-lease:{index}"
LEASABLE_DATABASES = range(1, 16)
#: A test's lease outlives any test; it lapses by itself if the test is killed.
TEST_LEASE_SECONDS = 900


@dataclass(frozen=True)
class ServiceSettings:
    redis_port: int
    rabbitmq_port: int
    rabbitmq_management_port: int
    postgres_port: int
    prometheus_port: int
    alertmanager_port: int
    user: str
    password: str


def settings() -> ServiceSettings:
    """Ports and credentials of the loopback services; a variable set in the environment (e.g.
    REDIS_PORT) wins over services.env, as it does for services.sh."""
    values = {**read_env_file(SERVICES_ENV), **{k: v for k, v in os.environ.items() if v}}

    def port(key: str) -> int:
        try:
            return int(values[key])
        except (KeyError, ValueError):
            raise ValueError(f"{key}={values.get(key)!r} in {SERVICES_ENV} (or the environment) must be a "
                             "port number 1-65535") from None

    return ServiceSettings(
        redis_port=port("REDIS_PORT"), rabbitmq_port=port("RABBITMQ_PORT"),
        rabbitmq_management_port=port("RABBITMQ_MGMT_PORT"), postgres_port=port("PG_PORT"),
        prometheus_port=port("PROMETHEUS_PORT"), alertmanager_port=port("ALERTMANAGER_PORT"),
        user=values["SERVICE_USER"], password=values["SERVICE_PASSWORD"])


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- Redis database leases -----------------------------------------------------------------------

def _on_database(url: str, index: int) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{index}"))


def _control(base_url: str):
    import redis

    return redis.Redis.from_url(_on_database(base_url, 0))


def _take_lease(control, token: str, ttl: int, order: Iterable[int]) -> int | None:
    for index in order:
        if control.set(LEASE_KEY.format(index=index), token, nx=True, ex=ttl):
            return index
    return None


def _held_lease(control, token: str) -> int | None:
    for index in LEASABLE_DATABASES:
        if control.get(LEASE_KEY.format(index=index)) == token.encode():
            return index
    return None


def _flush(base_url: str, index: int) -> None:
    import redis

    with redis.Redis.from_url(_on_database(base_url, index)) as client:
        client.flushdb()


@contextlib.contextmanager
def leased_redis_db(base_url: str, *, wait_seconds: float = 120) -> Iterator[str]:
    """Leases one Redis database index (1-15) for the duration, flushes it, yields its URL.

    Kombu keeps its `unacked` bookkeeping in fixed keys per database, so two tests sharing a
    database would restore each other's messages: a whole database per holder avoids that.
    """
    token = uuid.uuid4().hex
    with _control(base_url) as control:
        index = wait_for(f"a free Redis database index in {LEASABLE_DATABASES.start}..{LEASABLE_DATABASES.stop - 1}",
                         lambda: _take_lease(control, token, TEST_LEASE_SECONDS, LEASABLE_DATABASES),
                         timeout=wait_seconds, interval=0.5)
        key = LEASE_KEY.format(index=index)
        try:
            _flush(base_url, index)
            yield _on_database(base_url, index)
        finally:
            if control.get(key) == token.encode():
                control.delete(key)


def hold_redis_db(base_url: str, holder: str, ttl: int) -> int | None:
    """The database index leased to `holder` (renewed for `ttl` seconds), else a newly leased one
    taken from the top (15 down, away from the tests' end); None when every index is leased."""
    with _control(base_url) as control:
        index = _held_lease(control, holder)
        if index is not None:
            control.expire(LEASE_KEY.format(index=index), ttl)
            return index
        return _take_lease(control, holder, ttl, reversed(LEASABLE_DATABASES))


def release_redis_db(base_url: str, holder: str) -> int | None:
    """Flushes and releases the database leased to `holder`; returns its index (None if it held none)."""
    with _control(base_url) as control:
        index = _held_lease(control, holder)
        if index is not None:
            _flush(base_url, index)
            control.delete(LEASE_KEY.format(index=index))
        return index


# --- RabbitMQ and PostgreSQL ----------------------------------------------------------------------

@contextlib.contextmanager
def fresh_vhost(amqp_url: str, api_url: str) -> Iterator[str]:
    """Creates a RabbitMQ vhost, yields an AMQP URL on it, deletes it afterwards."""
    import httpx

    api = urlsplit(api_url)
    amqp = urlsplit(amqp_url)
    vhost = f"t-{uuid.uuid4().hex[:12]}"
    with httpx.Client(base_url=urlunsplit(api._replace(netloc=f"{api.hostname}:{api.port}")),
                      auth=(api.username, api.password), timeout=30) as client:
        client.put(f"/api/vhosts/{vhost}").raise_for_status()
        client.put(f"/api/permissions/{vhost}/{amqp.username}",
                   json={"configure": ".*", "write": ".*", "read": ".*"}).raise_for_status()
        try:
            yield urlunsplit(amqp._replace(path="/" + quote(vhost, safe="")))
        finally:
            client.delete(f"/api/vhosts/{vhost}")


@contextlib.contextmanager
def fresh_database(dsn: str) -> Iterator[str]:
    """Creates a PostgreSQL database, yields its DSN, drops it afterwards."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(urlsplit(dsn)._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
