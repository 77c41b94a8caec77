"""The demo's world outside its own pods: the e2e services in the cluster (e2e/services: the broker,
PostgreSQL, Alertmanager), and the demo's own corner of each (a vhost, a Redis database, a database).

Services run where a user's would, outside the worker pods, reached through Secrets: the pods use
their Service names (`rabbitmq.taskherd-services.svc`, …), this driver the tunnels of
e2e.services.access (the API server's port-forward). Nothing here depends on how the cluster routes to pods, so the same code runs
on the local cluster, on kind and on a remote cluster.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Callable

import httpx

from e2e.services import tenants
from e2e.services.endpoints import Endpoints as ServiceEndpoints

from .config import DATABASE, NAMESPACE, VHOST

#: the name the demo leases its Redis database under (e2e.services.tenants)
REDIS_OWNER = "taskherd-demo"


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
    host: Endpoints
    pods: Endpoints


def endpoints(services: ServiceEndpoints, broker: str, redis_db: int) -> Endpoints:
    """The demo's URLs on one side, from that side's service URLs."""
    redis_url = services.redis_db(redis_db)
    return Endpoints(
        broker_url=redis_url if broker == "redis" else services.amqp_vhost(VHOST),
        management_url=services.management,
        database_url=services.database(DATABASE),
        delivery_counter_url=redis_url,
        alertmanager_url=services.alertmanager,
    )


def prepare(*, broker: str, host: ServiceEndpoints, pods: ServiceEndpoints, log: Callable[[str], None]) -> World:
    """The demo's vhost, Redis database and database, fresh; the URLs to them from both sides."""
    redis_db, _ = tenants.lease_redis_database(host.redis_db(0), REDIS_OWNER, flush=True)
    tenants.fresh_vhost(host.management, VHOST)
    tenants.fresh_database(host.postgres, DATABASE)
    log(f"the demo's corner: Redis database {redis_db}, RabbitMQ vhost {VHOST}, PostgreSQL database {DATABASE}")
    return World(broker=broker, host=endpoints(host, broker, redis_db), pods=endpoints(pods, broker, redis_db))


def resolve_demo_alerts(alertmanager_url: str, *, now: dt.datetime | None = None) -> int:
    """Ends every alert Alertmanager holds for the demo's namespace (the operator that would have
    resolved them is gone with the release): re-posted with endsAt = now. Returns how many."""
    now = now or dt.datetime.now(dt.timezone.utc)
    r = httpx.get(f"{alertmanager_url}/api/v2/alerts", params={"filter": f'namespace="{NAMESPACE}"'}, timeout=10)
    r.raise_for_status()
    ended = [{"labels": a["labels"], "annotations": a.get("annotations") or {}, "startsAt": a["startsAt"],
              "endsAt": now.isoformat().replace("+00:00", "Z")} for a in r.json()]
    if ended:
        httpx.post(f"{alertmanager_url}/api/v2/alerts", json=ended, timeout=10).raise_for_status()
    return len(ended)


def tear_down(host: ServiceEndpoints, log: Callable[[str], None]) -> None:
    """The demo's corner of each service removed, its pages ended."""
    index = tenants.release_redis_database(host.redis_db(0), REDIS_OWNER)
    if index is not None:
        log(f"released Redis database {index}")
    if tenants.delete_vhost(host.management, VHOST):
        log(f"deleted RabbitMQ vhost {VHOST}")
    tenants.drop_database(host.postgres, DATABASE)
    log(f"dropped database {DATABASE}")
    ended = resolve_demo_alerts(host.alertmanager)
    if ended:
        log(f"ended {ended} alert(s) for {NAMESPACE} in Alertmanager")
