"""What the idempotency guard adds to an effect: round trips per side and CPU, Redis and PostgreSQL.

Each scenario runs `--keys` fresh keys, one effect each, in this process, against a private
redis-server (started here, so nothing else runs on it) and the loopback PostgreSQL (a fresh
database), and counts:

- round trips: requests the client waited for. Redis: packets sent by redis-py (a pipeline or a
  script is one) and packets the store sent on its own connection (a script; the commit of an
  effect queued with `in_transaction`). PostgreSQL: the protocol's synchronisation points in
  libpq's trace (one per statement, or per pipeline), transaction control included;
- CPU of this process (µs per task) and wall time.

Each guarded scenario is printed beside the same effect without a guard, so the difference is what
the guard costs. Target: one round trip per side (claim; complete), and the PostgreSQL
store adding nothing but its statements to the user's transaction.

    source scripts/services.sh env && .venv/bin/python bench/guard_cost.py [--keys 500]
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import psycopg
import redis

import repo_paths  # noqa: F401 - first: the shared helpers below live in the repository

from support.private_redis import PrivateRedis
from e2e.lib.services import fresh_database

from taskherd.worker.idempotency import PostgresStore, RedisStore
from taskherd.worker.idempotency import scripts as store_scripts

_sent = {"redis": 0}
_send = redis.connection.AbstractConnection.send_packed_command
_wire_send = store_scripts._Wire._send


def _counting_send(self, command, check_health=True):
    _sent["redis"] += 1
    return _send(self, command, check_health)


def _counting_wire_send(self, packet):
    _sent["redis"] += 1
    return _wire_send(self, packet)


redis.connection.AbstractConnection.send_packed_command = _counting_send
store_scripts._Wire._send = _counting_wire_send


class PgTrace:
    """Counts the synchronisation points (Sync, simple Query) in libpq's protocol trace."""

    def __init__(self, conn: psycopg.Connection, directory: Path):
        self.path = directory / f"pg-{uuid.uuid4().hex[:6]}.trace"
        self.file = open(self.path, "w")
        conn.pgconn.trace(self.file.fileno())
        conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS | psycopg.pq.Trace.REGRESS_MODE)

    def round_trips(self) -> int:
        self.file.flush()
        lines = self.path.read_text().splitlines()
        return sum(1 for line in lines if line.split("\t")[0] == "F" and len(line.split("\t")) > 2
                   and line.split("\t")[2] in ("Sync", "Query"))


def measure(name: str, keys: int, task, counter, prepare=None) -> dict:
    """Runs task(key) for `keys` fresh keys (after prepare(key), not measured); round trips (from
    counter()) and CPU per task."""
    for _ in range(20):
        task(f"warm-{uuid.uuid4().hex}")  # connections, scripts loaded, caches
    rounds, cpu, wall = 0, [], []
    for _ in range(keys):
        key = f"{name}-{uuid.uuid4().hex}"
        if prepare is not None:
            prepare(key)
        before = counter()
        started_cpu, started_wall = time.process_time(), time.perf_counter()
        task(key)
        cpu.append(time.process_time() - started_cpu)
        wall.append(time.perf_counter() - started_wall)
        rounds += counter() - before
    return {"round trips": rounds / keys, "CPU us": statistics.mean(cpu) * 1e6,
            "wall us": statistics.median(wall) * 1e6}


def redis_scenarios(url: str, keys: int) -> dict[str, dict]:
    client = redis.Redis.from_url(url)
    store = RedisStore(client=client)
    counter = lambda: _sent["redis"]  # noqa: E731

    def bare(key):
        client.rpush("effects", key)

    def guarded(key):
        with store.guard(key) as claim:
            if not claim.done:
                client.rpush("effects", key)
                claim.set_result(1)

    def transactional(key):
        with store.guard(key) as claim:
            if not claim.done:
                claim.in_transaction(lambda pipe: pipe.rpush("effects", key))

    results = {"effect alone (RPUSH)": measure("bare", keys, bare, counter),
               "guarded effect": measure("guard", keys, guarded, counter),
               "guarded, effect committed with the done mark": measure("tx", keys, transactional, counter)}
    results["a duplicate (done: result returned)"] = measure("dup", keys, guarded, counter, prepare=guarded)
    return results


def postgres_scenarios(dsn: str, keys: int, trace_dir: Path) -> dict[str, dict]:
    conn = psycopg.connect(dsn)
    store = PostgresStore()
    store.create_table(conn)
    with conn.transaction():
        conn.execute("CREATE TABLE IF NOT EXISTS effects (key text)")
    trace = PgTrace(conn, trace_dir)

    def bare(key):
        with conn.transaction():
            conn.execute("INSERT INTO effects (key) VALUES (%s)", (key,))

    def guarded(key):
        with store.guard(key, conn=conn) as claim:
            if not claim.done:
                conn.execute("INSERT INTO effects (key) VALUES (%s)", (key,))

    def inside(key):
        with conn.transaction():
            conn.execute("INSERT INTO effects (key) VALUES (%s)", (f"user-{key}",))  # the user's own work
            with store.guard(key, conn=conn) as claim:
                if not claim.done:
                    conn.execute("INSERT INTO effects (key) VALUES (%s)", (key,))

    def inside_bare(key):
        with conn.transaction():
            conn.execute("INSERT INTO effects (key) VALUES (%s)", (f"user-{key}",))
            conn.execute("INSERT INTO effects (key) VALUES (%s)", (key,))

    results = {"effect alone (its own transaction)": measure("pbare", keys, bare, trace.round_trips),
               "guarded effect (the guard's transaction)": measure("pguard", keys, guarded, trace.round_trips),
               "effect inside the user's transaction": measure("pib", keys, inside_bare, trace.round_trips),
               "guarded, inside the user's transaction": measure("pin", keys, inside, trace.round_trips)}
    conn.pgconn.untrace()
    conn.close()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=500)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="taskherd-guard-bench-") as scratch:
        server = PrivateRedis(Path(scratch))
        server.start()
        try:
            results = {"Redis": redis_scenarios(f"{server.url}/0", args.keys)}
        finally:
            server.stop()
        with fresh_database(os.environ["TASKHERD_PG_DSN"]) as dsn:
            results["PostgreSQL"] = postgres_scenarios(dsn, args.keys, Path(scratch))
    print(f"idempotency guard cost, {args.keys} keys per scenario, this process's CPU (mean) and wall (median)")
    print(f"{'store':<11}{'scenario':<48}{'round trips':>12}{'CPU us':>9}{'wall us':>9}")
    for store, scenarios in results.items():
        for scenario, figures in scenarios.items():
            print(f"{store:<11}{scenario:<48}{figures['round trips']:>12.2f}{figures['CPU us']:>9.0f}"
                  f"{figures['wall us']:>9.0f}")
    redis_added = results["Redis"]["guarded effect"]["round trips"] - results["Redis"]["effect alone (RPUSH)"]["round trips"]
    pg = results["PostgreSQL"]
    pg_added = pg["guarded, inside the user's transaction"]["round trips"] - \
        pg["effect inside the user's transaction"]["round trips"]
    redis_tx_added = results["Redis"]["guarded, effect committed with the done mark"]["round trips"] - \
        results["Redis"]["effect alone (RPUSH)"]["round trips"]
    print(f"Redis guard: {redis_added:.2f} round trips added per task (target 2: claim, complete)")
    print(f"Redis guard, effect committed with the done mark: {redis_tx_added:.2f} round trips added per task "
          "(the claim; the effect goes in the commit's one packet)")
    print(f"PostgreSQL guard inside the user's transaction: {pg_added:.2f} round trips added per task "
          f"(target 2: its INSERT and UPDATE, the savepoint travelling with them)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
