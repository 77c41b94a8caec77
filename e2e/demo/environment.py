"""The demo's world outside the cluster: the broker, the database and Alertmanager on this host,
reachable from the pods, and the demo's own corner of each (a vhost, a Redis database, a database).

Services run where a user's would, outside the worker pods, reached through Secrets. On this
machine they are the loopback services of scripts/services.sh, started with the cluster's bridge
address added to TASKHERD_SERVICES_BIND. When they already run on loopback only (started before
the cluster, shared by other work), the demo does not restart them under anybody's feet: it
forwards the bridge address to loopback with socat for the duration, and says so.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import httpx
import psycopg
import redis

from .config import DATABASE, REPO_ROOT, VHOST, state_dir

USER = PASSWORD = "taskherd"
PORTS = {"redis": 6390, "amqp": 5682, "management": 15682, "postgres": 5442, "alertmanager": 9393}
#: services.sh binds these to TASKHERD_SERVICES_BIND; the management API and Alertmanager listen on all
#: addresses already.
BOUND_TO_BIND_LIST = ("redis", "amqp", "postgres")
#: the Redis database leases of tests/support/services.py: the demo holds one like a test does, so
#: tests never flush the demo's database and the demo never touches theirs
LEASE_KEY = "taskherd-test:db-lease:{index}"
LEASE_TOKEN = "taskherd-demo"
LEASE_SECONDS = 7 * 24 * 3600


class ServiceError(RuntimeError):
    """A service the demo needs is missing or unreachable; the message says which and how to fix it."""


@dataclass(frozen=True)
class Endpoints:
    """Connection URLs for one side (the host running the demo, or the pods)."""

    broker_url: str
    management_url: str
    database_url: str
    delivery_counter_url: str
    alertmanager_url: str


@dataclass(frozen=True)
class World:
    broker: str  #: "redis" or "rabbitmq"
    pod_address: str  #: the host address pods connect to
    host: Endpoints
    pods: Endpoints
    forwarded_ports: tuple[int, ...]


def listening(address: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


def services_up(pod_address: str, log) -> None:
    """Starts whatever is not running, binding to loopback and the pods' address."""
    bind = f"127.0.0.1,{pod_address}"
    env = {**os.environ, "TASKHERD_SERVICES_BIND": bind}
    log(f"services: bash scripts/services.sh up (TASKHERD_SERVICES_BIND={bind})")
    r = subprocess.run(["bash", "scripts/services.sh", "up"], cwd=REPO_ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise ServiceError(f"scripts/services.sh up failed ({r.returncode}):\n{(r.stderr or r.stdout)[-2000:]}")


def ensure_reachable_from_pods(pod_address: str, log) -> tuple[int, ...]:
    """Makes each service answer on the pods' address; returns the ports that needed a forwarder."""
    forwarded = []
    for name in BOUND_TO_BIND_LIST:
        port = PORTS[name]
        if listening(pod_address, port):
            if forwarder_alive(port):
                forwarded.append(port)
            continue
        if not listening("127.0.0.1", port):
            raise ServiceError(f"{name} is not listening on 127.0.0.1:{port}: `bash scripts/services.sh up`")
        start_forwarder(pod_address, port)
        forwarded.append(port)
    if forwarded:
        log(f"services: {', '.join(map(str, forwarded))} listen on loopback only (started before the cluster);"
            f" forwarding {pod_address} → 127.0.0.1 with socat for the demo. Restart them with "
            f"TASKHERD_SERVICES_BIND=127.0.0.1,{pod_address} to connect the pods directly.")
    for name in ("management", "alertmanager"):
        if not listening(pod_address, PORTS[name]):
            raise ServiceError(f"{name} does not answer on {pod_address}:{PORTS[name]} (pods could not reach it)")
    return tuple(forwarded)


def _forwarder_pidfile(port: int) -> Path:
    return state_dir() / f"forward-{port}.pid"


def start_forwarder(address: str, port: int) -> None:
    socat = shutil.which("socat")
    if not socat:
        subprocess.run(["apt-get", "install", "-y", "-q", "socat"], check=True, capture_output=True, timeout=300)
        socat = shutil.which("socat") or "/usr/bin/socat"
    stop_forwarder(port)
    log_path = state_dir() / f"forward-{port}.log"
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen([socat, f"TCP-LISTEN:{port},bind={address},reuseaddr,fork",
                                 f"TCP:127.0.0.1:{port}"], stdout=log_file, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    _forwarder_pidfile(port).write_text(f"{proc.pid} {os.path.realpath(socat)}\n")
    for _ in range(50):
        if listening(address, port, timeout=0.2):
            return
        if proc.poll() is not None:
            raise ServiceError(f"socat forwarding {address}:{port} exited: {log_path.read_text()[-500:]}")
        time.sleep(0.1)
    raise ServiceError(f"socat forwarding {address}:{port} is not listening after 5 s")


def forwarder_alive(port: int) -> bool:
    """Whether the socat this demo started for `port` (a previous run's, kept until demo-down) still runs."""
    pidfile = _forwarder_pidfile(port)
    if not pidfile.exists():
        return False
    pid_text, _, exe = pidfile.read_text().strip().partition(" ")
    return os.path.realpath(f"/proc/{pid_text}/exe") == exe


def stop_forwarder(port: int) -> bool:
    """Stops the forwarder this demo started on `port` (by its recorded PID and executable)."""
    pidfile = _forwarder_pidfile(port)
    if not pidfile.exists():
        return False
    pid_text, _, exe = pidfile.read_text().strip().partition(" ")
    pidfile.unlink()
    try:
        if os.path.realpath(f"/proc/{pid_text}/exe") != exe:
            return False  # gone, or the PID now belongs to something else
        os.killpg(int(pid_text), signal.SIGTERM)  # socat forks one child per connection: its own session
        return True
    except (OSError, ValueError):
        return False


def stop_all_forwarders() -> list[int]:
    return [p for p in PORTS.values() if stop_forwarder(p)]


def lease_redis_database() -> int:
    """A Redis database index (1-15) for the demo, leased the way tests lease theirs, reused across runs."""
    control = redis.Redis(host="127.0.0.1", port=PORTS["redis"], db=0)
    try:
        for index in range(15, 0, -1):
            if control.get(LEASE_KEY.format(index=index)) == LEASE_TOKEN.encode():
                control.expire(LEASE_KEY.format(index=index), LEASE_SECONDS)
                return index
        for index in range(15, 0, -1):
            if control.set(LEASE_KEY.format(index=index), LEASE_TOKEN, nx=True, ex=LEASE_SECONDS):
                return index
    finally:
        control.close()
    raise ServiceError("every Redis database index 1-15 is leased (tests running?): try again shortly")


def release_redis_database() -> int | None:
    control = redis.Redis(host="127.0.0.1", port=PORTS["redis"], db=0)
    try:
        for index in range(15, 0, -1):
            key = LEASE_KEY.format(index=index)
            if control.get(key) == LEASE_TOKEN.encode():
                redis.Redis(host="127.0.0.1", port=PORTS["redis"], db=index).flushdb()
                control.delete(key)
                return index
    finally:
        control.close()
    return None


def _admin_dsn(database: str = "taskherd") -> str:
    return f"postgresql://{USER}:{PASSWORD}@127.0.0.1:{PORTS['postgres']}/{database}"


def reset_database() -> None:
    """A fresh, empty demo database (the previous run's ledger goes with it)."""
    with psycopg.connect(_admin_dsn(), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{DATABASE}"')


def drop_database() -> None:
    with psycopg.connect(_admin_dsn(), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')


def _management() -> httpx.Client:
    return httpx.Client(base_url=f"http://127.0.0.1:{PORTS['management']}", auth=(USER, PASSWORD), timeout=30)


def reset_vhost() -> None:
    with _management() as api:
        api.delete(f"/api/vhosts/{quote(VHOST, safe='')}")
        api.put(f"/api/vhosts/{quote(VHOST, safe='')}").raise_for_status()
        api.put(f"/api/permissions/{quote(VHOST, safe='')}/{USER}",
                json={"configure": ".*", "write": ".*", "read": ".*"}).raise_for_status()


def delete_vhost() -> None:
    with _management() as api:
        api.delete(f"/api/vhosts/{quote(VHOST, safe='')}")


def endpoints(address: str, broker: str, redis_db: int) -> Endpoints:
    redis_url = f"redis://{address}:{PORTS['redis']}/{redis_db}"
    amqp_url = f"amqp://{USER}:{PASSWORD}@{address}:{PORTS['amqp']}/{quote(VHOST, safe='')}"
    return Endpoints(
        broker_url=redis_url if broker == "redis" else amqp_url,
        management_url=f"http://{USER}:{PASSWORD}@{address}:{PORTS['management']}",
        database_url=f"postgresql://{USER}:{PASSWORD}@{address}:{PORTS['postgres']}/{DATABASE}",
        delivery_counter_url=redis_url,
        alertmanager_url=f"http://{address}:{PORTS['alertmanager']}",
    )


def prepare(*, broker: str, pod_address: str, log) -> World:
    """Services up and reachable from the pods; the demo's vhost, Redis database and database fresh."""
    if not all(listening("127.0.0.1", PORTS[n]) for n in PORTS):
        services_up(pod_address, log)
    forwarded = ensure_reachable_from_pods(pod_address, log)
    redis_db = lease_redis_database()
    redis.Redis(host="127.0.0.1", port=PORTS["redis"], db=redis_db).flushdb()
    reset_vhost()
    reset_database()
    return World(broker=broker, pod_address=pod_address, host=endpoints("127.0.0.1", broker, redis_db),
                 pods=endpoints(pod_address, broker, redis_db), forwarded_ports=forwarded)


def tear_down(log) -> None:
    stopped = stop_all_forwarders()
    if stopped:
        log(f"stopped the socat forwarders on {', '.join(map(str, stopped))}")
    index = release_redis_database()
    if index is not None:
        log(f"released Redis database {index}")
    if listening("127.0.0.1", PORTS["management"]):
        delete_vhost()
        log(f"deleted RabbitMQ vhost {VHOST}")
    if listening("127.0.0.1", PORTS["postgres"]):
        drop_database()
        log(f"dropped database {DATABASE}")
