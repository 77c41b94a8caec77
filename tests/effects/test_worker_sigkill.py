"""SIGKILL of a whole worker (main process and pool children, `os.killpg`) in the middle of a task.

The task's effect is guarded by the PostgreSQL idempotency store in the same transaction as the
effect. Killed at "inside" (transaction open), the attempt's effect rolls back with its connection
and the rerun records it. Killed at "after" (effect committed, message not yet acknowledged), the
rerun finds the key done and does not repeat the effect: the case idempotency exists for.
RabbitMQ requeues the message as soon as the dead worker's connection closes. Redis keeps it in
`unacked` until the visibility timeout has passed since its delivery and a restore sweep runs;
docs/effects.md records what was measured.
"""
from __future__ import annotations

import os
import signal
import time
import warnings

import psycopg
import redis
import pytest
from celery import Celery

from apps.effects_schema import create_tables
from e2e.lib.waiting import wait_for
from taskherd.worker import ProfileWarning, configure


def rows(dsn: str, query: str, *params) -> list[tuple]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(query, params).fetchall()


def producer_app(broker_url: str, queue: str) -> Celery:
    """A producer declares the work queue exactly as the workers do (dead-letter arguments), or
    RabbitMQ refuses the declaration: producers call configure() too."""
    producer = Celery(broker=broker_url, set_as_current=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileWarning)
        configure(producer, queues=[queue])
    return producer


def kill_whole_worker_mid_task(broker_url, dsn, queue, worker_factory, *, at, visibility_timeout=None,
                               fast_recovery=True):
    """Runs one task on one of two workers, SIGKILLs that worker's process group mid-task, and
    returns (attempts, ledger rows, seconds from first attempt to rerun, seconds from kill to rerun)."""
    create_tables(dsn)
    env = {"TEST_BROKER_URL": broker_url, "TEST_QUEUE": queue, "TEST_PG_DSN": dsn, "TEST_SLOW_FIRST_SECONDS": "300",
           "TEST_SLOW_FIRST_AT": at}
    if visibility_timeout:
        env["TEST_VISIBILITY_TIMEOUT"] = str(visibility_timeout)
    if not fast_recovery:
        env["TEST_FAST_RECOVERY"] = "0"
    workers = [worker_factory("apps.effects_app", queues=[queue], env=env, concurrency=1) for _ in range(2)]

    producer = producer_app(broker_url, queue)
    task_id = producer.send_task("effects.record", args=[42], queue=queue).id
    producer.close()
    [(first_host,)] = wait_for("first attempt", lambda: rows(dsn, "SELECT hostname FROM attempts"), timeout=60)
    victim = next(w for w in workers if first_host.startswith(w.hostname.split("@")[0] + "@"))
    survivor = next(w for w in workers if w is not victim)
    victim.wait_for_log("effects: first attempt", timeout=30)
    effects_before_kill = len(rows(dsn, "SELECT 1 FROM ledger"))
    assert effects_before_kill == (1 if at == "after" else 0)

    os.killpg(victim.pid, signal.SIGKILL)
    killed_at = time.time()
    victim.wait(timeout=10)

    wait_for("a rerun", lambda: len(rows(dsn, "SELECT 1 FROM attempts")), until=lambda runs: runs >= 2,
             timeout=90 + (visibility_timeout or 0))
    survivor.wait_for_log("succeeded", timeout=60)
    time.sleep(1)  # a third run, if there were one, would show up here
    attempts = rows(dsn, "SELECT hostname, extract(epoch FROM at) FROM attempts WHERE task_id = %s ORDER BY at", task_id)
    ledger = rows(dsn, "SELECT who FROM ledger WHERE key = %s", f"task:{task_id}")
    since_first = float(attempts[1][1] - attempts[0][1])
    since_kill = float(attempts[1][1]) - killed_at
    print(f"\n{broker_url.split(':')[0]}, killed {at} the transaction: attempts={len(attempts)} effects={len(ledger)} "
          f"rerun {since_kill:.1f}s after the kill, {since_first:.1f}s after the first attempt started")
    assert attempts[1][0] != attempts[0][0] and attempts[1][0].startswith(survivor.hostname.split("@")[0])
    return attempts, ledger, since_first, since_kill


@pytest.mark.slow
@pytest.mark.parametrize("at", ["inside", "after"])
def test_rabbitmq_task_of_a_killed_worker_runs_again_on_another_and_its_effect_is_recorded_once(
        at, amqp_url, pg_dsn, unique_name, worker_factory):
    attempts, ledger, _, since_kill = kill_whole_worker_mid_task(amqp_url, pg_dsn, unique_name, worker_factory, at=at)
    assert (len(attempts), len(ledger)) == (2, 1)
    assert since_kill < 15, f"RabbitMQ requeues on connection close; the rerun came {since_kill:.1f}s after the kill"


@pytest.mark.slow
@pytest.mark.parametrize("at", ["inside", "after"])
def test_redis_task_of_a_killed_worker_comes_back_after_the_visibility_timeout(
        at, redis_url, pg_dsn, unique_name, worker_factory):
    attempts, ledger, since_first, _ = kill_whole_worker_mid_task(
        redis_url, pg_dsn, unique_name, worker_factory, at=at, visibility_timeout=10, fast_recovery=False)
    assert (len(attempts), len(ledger)) == (2, 1)
    # Not before the visibility timeout (counted from delivery, just before the first attempt),
    # and soon after it: the sweep runs every second (unacked_restore_interval=1, throttle=1).
    assert 9.5 <= since_first <= 10 + 10, since_first


@pytest.mark.slow
def test_concurrent_redeliveries_on_two_workers_run_the_redis_guarded_effect_once(
        broker_url, redis_url, unique_name, worker_factory):
    """One message delivered twice at once (same task id) to two real workers: one runs the effect,
    the other meets the key in progress, raises InProgress, is retried by the taskherd Task class with
    backoff and then returns the stored result without running the effect."""
    env = {"TEST_BROKER_URL": broker_url, "TEST_QUEUE": unique_name, "TEST_REDIS_URL": redis_url}
    workers = [worker_factory("apps.effects_app", queues=[unique_name], env=env, concurrency=1) for _ in range(2)]
    producer = producer_app(broker_url, unique_name)
    task_id = "duplicate-delivery-1"
    for _ in range(2):
        producer.send_task("effects.redis_record", args=[7], queue=unique_name, task_id=task_id)
    producer.close()

    client = redis.Redis.from_url(redis_url)
    wait_for("both deliveries done", lambda: sum(w.log().count(f"[{task_id}] succeeded") for w in workers),
             timeout=90, equals=2)
    logs = "".join(w.log() for w in workers)
    assert client.lrange(f"ledger:{task_id}", 0, -1) == [b"7"]
    assert "InProgress" in logs and client.llen(f"attempts:{task_id}") >= 3, logs[-3000:]
    assert logs.count("{'order': 7}") == 2  # the duplicate returned the stored result
