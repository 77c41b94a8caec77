"""Connection URLs of the services, from either side: pods (Service DNS names and the services'
own ports) or this host (127.0.0.1 and the local ports of the tunnels, forward.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping
from urllib.parse import quote

from .config import COMPONENTS, NAMESPACE, PORTS


@dataclass(frozen=True)
class Credentials:
    """From the services Secret; generated URL-safe (token_urlsafe), so they go into URLs as they are."""

    username: str
    password: str
    redis_password: str

    @classmethod
    def from_secret_data(cls, data: Mapping[str, str]) -> "Credentials":
        return cls(username=data["username"], password=data["password"], redis_password=data["redis-password"])


class NotDeployed(LookupError):
    """A URL of a component that is not deployed (or not forwarded) was asked for."""


@dataclass(frozen=True)
class Endpoints:
    """Base URLs of the services, as one side reaches them; None for a component not deployed.

    Each base URL names no database: `redis_db(n)`, `amqp_vhost(v)` and `database(d)` add one.
    """

    redis: str | None
    amqp: str | None
    management: str | None
    postgres: str | None
    alertmanager: str | None
    prometheus: str | None

    def _need(self, attribute: str) -> str:
        value = getattr(self, attribute)
        if value is None:
            raise NotDeployed(f"{attribute}: that service is not deployed or not forwarded "
                              f"(`python -m e2e.services up`, components include it)")
        return value

    def redis_db(self, index: int) -> str:
        if not 0 <= index <= 15:
            raise ValueError(f"Redis database index {index}: must be 0-15")
        return f"{self._need('redis')}/{index}"

    def amqp_vhost(self, vhost: str = "/") -> str:
        return f"{self._need('amqp')}/{quote(vhost, safe='')}"

    def database(self, name: str = "taskherd") -> str:
        return f"{self._need('postgres')}/{name}"

    def url(self, component: str) -> str:
        """The component's main URL: what a readiness check or a status line shows."""
        return self._need({"rabbitmq": "amqp"}.get(component, component))


def _urls(credentials: Credentials, address: Mapping[str, tuple[str, Mapping[str, int]]]) -> Endpoints:
    """address: component -> (host, {port name: port}) for each reachable component."""
    u, p, r = credentials.username, credentials.password, credentials.redis_password

    def at(component: str, port: str, template: str) -> str | None:
        if component not in address:
            return None
        host, ports = address[component]
        return template.format(host=host, port=ports[port])

    return Endpoints(
        redis=at("redis", "redis", f"redis://:{r}@{{host}}:{{port}}"),
        amqp=at("rabbitmq", "amqp", f"amqp://{u}:{p}@{{host}}:{{port}}"),
        management=at("rabbitmq", "management", f"http://{u}:{p}@{{host}}:{{port}}"),
        postgres=at("postgres", "postgres", f"postgresql://{u}:{p}@{{host}}:{{port}}"),
        alertmanager=at("alertmanager", "http", "http://{host}:{port}"),
        prometheus=at("prometheus", "http", "http://{host}:{port}"),
    )


def in_cluster(credentials: Credentials, *, namespace: str = NAMESPACE,
               components: tuple[str, ...] = COMPONENTS) -> Endpoints:
    """What pods use: `<component>.<namespace>.svc` resolves in every namespace on any cluster
    domain (the pod's DNS search path ends in the domain)."""
    return _urls(credentials, {c: (f"{c}.{namespace}.svc", PORTS[c]) for c in components})


def on_host(credentials: Credentials, local_ports: Mapping[str, Mapping[str, int]]) -> Endpoints:
    """What this host uses through the tunnels: local_ports[component][port name] = local port."""
    return _urls(credentials, {c: ("127.0.0.1", ports) for c, ports in local_ports.items()})
