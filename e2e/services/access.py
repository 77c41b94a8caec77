"""This host's view of the services: tunnels up (forward.py), each service answering its own
protocol through them, the host-side URLs yielded."""
from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import httpx
import kombu
import psycopg
import redis

from e2e.lib import cluster as clusters

from .deploy import Deployed
from .endpoints import Endpoints, on_host
from .forward import port_forwards, wait_answering


def _redis(e: Endpoints) -> None:
    with redis.Redis.from_url(e.redis_db(0), socket_timeout=5, socket_connect_timeout=5) as client:
        client.ping()


def _rabbitmq(e: Endpoints) -> None:
    with kombu.Connection(e.amqp_vhost("/"), connect_timeout=5) as connection:
        connection.connect()
    with httpx.Client(timeout=5) as http:
        http.get(f"{e.management}/api/overview").raise_for_status()


def _postgres(e: Endpoints) -> None:
    psycopg.connect(e.database("postgres"), connect_timeout=5).close()


def _http_ready(attribute: str) -> Callable[[Endpoints], None]:
    def probe(e: Endpoints) -> None:
        httpx.get(f"{getattr(e, attribute)}/-/ready", timeout=5).raise_for_status()
    return probe


#: one request each service answers only when it works (a forwarded port accepts regardless)
ANSWERS: dict[str, Callable[[Endpoints], None]] = {
    "redis": _redis, "rabbitmq": _rabbitmq, "postgres": _postgres,
    "alertmanager": _http_ready("alertmanager"), "prometheus": _http_ready("prometheus"),
}


def wait_until_answering(endpoints: Endpoints, components: tuple[str, ...], timeout: float = 120) -> None:
    for component in components:
        wait_answering(f"{component} to answer at {endpoints.url(component).rpartition('@')[2]}",
                       lambda c=component: ANSWERS[c](endpoints), timeout)


@contextlib.contextmanager
def reach(cluster: clusters.Cluster, deployed: Deployed, *, timeout: float = 120,
          log: Callable[[str], None] = print) -> Iterator[Endpoints]:
    """Tunnels to every deployed service for the duration; yields the URLs this host uses."""
    components = deployed.settings.components
    with port_forwards(cluster, components, namespace=deployed.namespace, timeout=timeout) as local:
        endpoints = on_host(deployed.credentials, local)
        wait_until_answering(endpoints, components, timeout)
        log("services reached through the API server's port-forward: " + ", ".join(
            f"{c} 127.0.0.1:{'/'.join(str(p) for p in local[c].values())}" for c in components))
        yield endpoints
