"""An app's own corner of the shared services: a RabbitMQ vhost, a PostgreSQL database, and a Redis
database index leased by name.

Redis has 16 numbered databases and no names: database 0 holds the registry (a hash, index ->
owner), 1-15 are leased. A lease is kept until released (`python -m e2e.services redis-db --release
OWNER`): the demo's database survives between `make demo` runs, a user's app keeps its own.
"""
from __future__ import annotations

import re
from typing import Mapping
from urllib.parse import quote, urlsplit, urlunsplit

import httpx
import psycopg
import redis

REGISTRY_KEY = "taskherd:redis-databases"
LEASABLE = range(1, 16)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class TenantError(ValueError):
    """A name is invalid or every Redis database is leased; the message says which and what is valid."""


def _check_owner(owner: str) -> None:
    if not _NAME.match(owner or ""):
        raise TenantError(f"owner {owner!r}: 1-63 characters, letters, digits, '.', '_' or '-', "
                          f"starting with a letter or digit")


def choose_database(owners: Mapping[int, str], owner: str) -> tuple[int | None, bool]:
    """(index, already held): the owner's existing lease, else the lowest free index, else None."""
    for index, holder in owners.items():
        if holder == owner:
            return index, True
    free = [i for i in LEASABLE if i not in owners]
    return (free[0] if free else None), False


def _database(redis_url: str, index: int) -> redis.Redis:
    """A client on database `index` of the Redis the URL names (whatever database the URL names)."""
    return redis.Redis.from_url(urlunsplit(urlsplit(redis_url)._replace(path=f"/{index}")), socket_timeout=10)


def _registry(redis_url: str) -> redis.Redis:
    return _database(redis_url, 0)


def _flush(redis_url: str, index: int) -> None:
    with _database(redis_url, index) as client:
        client.flushdb()


def lease_owners(redis_url: str) -> dict[int, str]:
    with _registry(redis_url) as client:
        return {int(k): v.decode() for k, v in client.hgetall(REGISTRY_KEY).items()}


def lease_redis_database(redis_url: str, owner: str, *, flush: bool = False) -> tuple[int, bool]:
    """(index, new): the database `owner` holds, leasing the lowest free one if it holds none. A new
    lease starts empty; with flush, a held one is emptied too."""
    _check_owner(owner)
    with _registry(redis_url) as client:
        for _ in range(len(LEASABLE) + 1):  # another owner may take an index between read and write
            owners = {int(k): v.decode() for k, v in client.hgetall(REGISTRY_KEY).items()}
            index, held = choose_database(owners, owner)
            if index is None:
                listing = ", ".join(f"{i}={o}" for i, o in sorted(owners.items()))
                raise TenantError(f"every Redis database 1-15 is leased ({listing}): release one with "
                                  f"`python -m e2e.services redis-db --release OWNER`")
            if held:
                if flush:
                    _flush(redis_url, index)
                return index, False
            if client.hsetnx(REGISTRY_KEY, str(index), owner):
                _flush(redis_url, index)
                return index, True
    raise TenantError("the Redis database registry kept changing under us: try again")


def release_redis_database(redis_url: str, owner: str) -> int | None:
    """Flush and release the owner's database; its index, or None if it held none."""
    _check_owner(owner)
    with _registry(redis_url) as client:
        for key, holder in client.hgetall(REGISTRY_KEY).items():
            if holder.decode() == owner:
                index = int(key)
                _flush(redis_url, index)
                client.hdel(REGISTRY_KEY, key)
                return index
    return None


def _management(management_url: str) -> httpx.Client:
    parts = urlsplit(management_url)
    base = urlunsplit(parts._replace(netloc=f"{parts.hostname}:{parts.port}"))
    return httpx.Client(base_url=base, auth=(parts.username, parts.password), timeout=30)


def fresh_vhost(management_url: str, vhost: str) -> None:
    """The vhost, empty (a previous one of that name is deleted with its queues), with the services
    user allowed everything in it."""
    if not _NAME.match(vhost or ""):
        raise TenantError(f"vhost {vhost!r}: 1-63 characters, letters, digits, '.', '_' or '-'")
    user = urlsplit(management_url).username
    with _management(management_url) as api:
        name = quote(vhost, safe="")
        api.delete(f"/api/vhosts/{name}")
        api.put(f"/api/vhosts/{name}").raise_for_status()
        api.put(f"/api/permissions/{name}/{user}", json={"configure": ".*", "write": ".*", "read": ".*"}).raise_for_status()


def delete_vhost(management_url: str, vhost: str) -> bool:
    with _management(management_url) as api:
        return api.delete(f"/api/vhosts/{quote(vhost, safe='')}").status_code == 204


def _check_identifier(database: str) -> None:
    if not _IDENTIFIER.match(database or ""):
        raise TenantError(f"database {database!r}: lower-case letters, digits and '_', starting with a letter "
                          f"or '_', at most 63 characters")


def fresh_database(postgres_url: str, database: str) -> None:
    """The database, empty (a previous one of that name is dropped, its connections closed)."""
    _check_identifier(database)
    with psycopg.connect(f"{postgres_url}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{database}"')


def drop_database(postgres_url: str, database: str) -> None:
    _check_identifier(database)
    with psycopg.connect(f"{postgres_url}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
