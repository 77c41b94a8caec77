"""The sample shop app (examples/shop) on real workers and brokers on this host, before any cluster:
pool children SIGKILLed mid-charge, a flaky gateway, a poison charge — every charge recorded once,
the poison in the DLQ, and the demo's own verdict says so."""
from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import psycopg
import pytest

from e2e.demo import ledger
from e2e.demo.verdict import Observed, Sent, judge
from e2e.lib.waiting import wait_for

SHOP = Path(__file__).resolve().parents[2] / "examples" / "shop"

pytestmark = pytest.mark.slow


def runtime_env(directory: Path) -> dict[str, str]:
    """Per-worker heartbeat directory and no metrics HTTP server: several workers share this host."""
    directory.mkdir(parents=True, exist_ok=True)
    return {"TASKHERD_HEARTBEAT_DIR": str(directory), "TASKHERD_METRICS_PORT": "0"}


def test_charges_recorded_once_through_killed_children_flaky_gateway_and_poison(
        broker_url, pg_dsn, worker_factory, unique_name, tmp_path, monkeypatch):
    management_url = os.environ.get("TASKHERD_RABBITMQ_API_URL")
    env = {"TASKHERD_BROKER_URL": broker_url, "SHOP_DATABASE_URL": pg_dsn, "SHOP_QUEUE": unique_name,
           "SHOP_CHARGE_SECONDS": "0.8", "SHOP_GATEWAY_FAILURE_RATE": "0.3",
           "PYTHONPATH": str(SHOP)}
    # configure() lets TASKHERD_BROKER_URL win over the app's broker (the chart's contract): the
    # producer in this process must see this test's broker
    monkeypatch.setenv("TASKHERD_BROKER_URL", broker_url)
    from shop import db
    from shop.app import make_app

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        db.create_schema(conn)
    producer = make_app(broker_url=broker_url, queue=unique_name)
    workers = [worker_factory("shop.app", queues=[unique_name], env={**env, **runtime_env(tmp_path / f"w{i}")},
                              concurrency=2) for i in range(2)]

    run = uuid.uuid4().hex[:6]
    charges = [f"ch-{run}-{i:03d}" for i in range(24)]
    for i, charge_id in enumerate(charges):
        producer.send_task("shop.charge", kwargs={"charge_id": charge_id, "customer": f"cust-{i % 5}",
                                                  "amount_cents": 100 + i}, queue=unique_name)
    producer.send_task("shop.charge", kwargs={"charge_id": f"bad-{run}", "customer": "cust-x", "amount_cents": -5},
                       queue=unique_name)

    killed: list[str] = []
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for _ in range(2):  # SIGKILL the pool child running a charge, twice (what an OOM kill does)
            row = wait_for("a charge in flight", lambda: conn.execute(
                "SELECT key, pid FROM shop_attempts WHERE finished_at IS NULL AND task_name = 'shop.charge' "
                "AND started_at < clock_timestamp() - interval '0.2 s' AND NOT (key = ANY(%s)) "
                "ORDER BY id DESC LIMIT 1", (killed,)).fetchone(), timeout=30,
                explain=lambda: "\n".join(w.tail(30) for w in workers))
            os.kill(row[1], signal.SIGKILL)
            killed.append(row[0])

        def settled():
            effects = ledger.read_effects(conn)
            dead = ledger.read_dead_letters(broker_url, f"{unique_name}.dlq", management_url=management_url)
            return (effects, dead) if all(effects.get(c) for c in charges) and dead else None

        def explain():
            effects = ledger.read_effects(conn)
            return (f"missing: {[c for c in charges if not effects.get(c)]}\n"
                    f"dlq: {ledger.read_dead_letters(broker_url, f'{unique_name}.dlq', management_url=management_url)}\n"
                    + "\n".join(w.tail(40) for w in workers))

        effects, dead = wait_for("every charge recorded and the poison dead-lettered", settled, timeout=90,
                                 explain=explain)
        time.sleep(2)  # a duplicate would show up now: the killed children's messages are back in play
        effects, attempts = ledger.read_effects(conn), ledger.read_attempts(conn)
        dead = ledger.read_dead_letters(broker_url, f"{unique_name}.dlq", management_url=management_url)

    verdict = judge(Sent(charges=tuple(charges), poison=(f"bad-{run}",)),
                    Observed(effects=effects, attempts=attempts, dead_letters=dead, expect=frozenset()))
    assert verdict.ok, verdict.failures
    assert verdict.lost == [] and verdict.duplicated == {}
    per_key = ledger.attempts_by_key(attempts)
    for key in killed:  # the killed attempt never finished, the redelivery did
        assert per_key[key] >= 2, (key, per_key[key])
    assert verdict.interrupted_attempts >= 2
    # the flaky gateway made some charge retry (P(no failure in 24+ calls at 30 %) < 0.0002)
    assert any(a.outcome == "RETRY" for a in attempts), [a.outcome for a in attempts]
    [poison] = dead
    assert poison.key == f"bad-{run}" and poison.reason.startswith("permanent-error"), poison
    assert poison.attempts == 1 and poison.exception_type.endswith("InvalidCharge")
    assert all(w.is_running() for w in workers)  # killed children were replaced, the workers kept going


class MemoryCgroup:
    """A memory cgroup of our own with a hard limit (v1 or v2), like a container's: the kernel
    OOM-kills inside it when the processes in it outgrow the limit."""

    def __init__(self, name: str, limit_bytes: int):
        v1 = Path("/sys/fs/cgroup/memory")
        self.v2 = not v1.is_dir()
        self.path = (Path("/sys/fs/cgroup") if self.v2 else v1) / name
        self.path.mkdir()
        (self.path / ("memory.max" if self.v2 else "memory.limit_in_bytes")).write_text(str(limit_bytes))

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def oom_kills(self) -> int:
        text = (self.path / ("memory.events" if self.v2 else "memory.oom_control")).read_text()
        return next((int(line.split()[1]) for line in text.splitlines() if line.startswith("oom_kill ")), 0)

    def remove(self) -> None:
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.2)


def test_report_outgrowing_its_memory_limit_is_oom_killed_then_dead_lettered(redis_url, pg_dsn, worker_factory,
                                                                               unique_name, tmp_path, monkeypatch):
    """What the demo's OOM fault relies on: the kernel kills the pool child running the report, the
    message comes back (reject on worker lost), and after max_deliveries (3) taskherd dead-letters it
    unrun while the charges beside it complete."""
    env = {"TASKHERD_BROKER_URL": redis_url, "SHOP_DATABASE_URL": pg_dsn, "SHOP_QUEUE": unique_name,
           "SHOP_CHARGE_SECONDS": "0.2", "SHOP_GATEWAY_FAILURE_RATE": "0", "PYTHONPATH": str(SHOP)}
    monkeypatch.setenv("TASKHERD_BROKER_URL", redis_url)
    from shop import db
    from shop.app import make_app

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        db.create_schema(conn)
    cgroup = MemoryCgroup(unique_name, 400 * 1024 * 1024)
    try:
        worker = worker_factory("shop.app", queues=[unique_name], env={**env, **runtime_env(tmp_path)}, concurrency=2)
        for pid in [worker.pid, *worker.child_pids()]:
            cgroup.add(pid)
        producer = make_app(broker_url=redis_url, queue=unique_name)
        producer.send_task("shop.build_report", kwargs={"report_id": "huge", "megabytes": 1024}, queue=unique_name)
        charges = [f"ch-{i}" for i in range(10)]
        for i, c in enumerate(charges):
            producer.send_task("shop.charge", kwargs={"charge_id": c, "customer": "c", "amount_cents": 100 + i},
                               queue=unique_name)
        dead = wait_for("the report in the DLQ", lambda: ledger.read_dead_letters(redis_url, f"{unique_name}.dlq"),
                        timeout=120, explain=lambda: worker.tail(40))
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            wait_for("the charges", lambda: all(ledger.read_effects(conn).get(c) for c in charges), timeout=60)
            attempts = [a for a in ledger.read_attempts(conn) if a.task_name == "shop.build_report"]
        assert cgroup.oom_kills() >= 1
        [report] = dead
        assert report.key == "huge" and report.reason.startswith("killed-worker"), report
        killed = [a for a in attempts if a.finished_at is None]
        assert len(killed) == 3, attempts  # max_deliveries: three runs, each OOM-killed
        # the fourth delivery is dead-lettered before the body runs (it fails in well under a second)
        assert all(a.outcome == "FAILURE" and a.finished_at - a.started_at < 1 for a in attempts if a not in killed)
        assert worker.is_running()
    finally:
        for w in [worker] if "worker" in locals() else []:
            w.kill()
        cgroup.remove()
