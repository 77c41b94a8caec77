"""The services a chaos run breaks, and each app's corner of them.

The suite restarts brokers and databases and cuts pods off from them, so it never uses the shared
`taskherd-services` (the demo and the other tests rely on it): it deploys its own instances with
e2e/services, in namespaces of its own, kept between runs like the shared ones
(`python -m e2e.chaos down` removes them):

- `taskherd-chaos`: Redis, RabbitMQ (one node), PostgreSQL — the broker, the delivery counter,
  the ledger's database;
- `taskherd-chaos-store`: a Redis of its own for the idempotency store, so that "the store is
  unreachable" does not also cut the broker off;
- `taskherd-chaos-quorum`: RabbitMQ as a 3-node cluster with quorum queues, only when a fault
  needs it.

Each installed app gets, per run, a fresh vhost, database and leased Redis databases
(e2e.services.tenants), named after its namespace, and gives them back at the end.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterator

from e2e.lib import cluster as clusters
from e2e.services import access, deploy, tenants
from e2e.services.endpoints import Endpoints

SERVICES_NAMESPACE = "taskherd-chaos"
STORE_NAMESPACE = "taskherd-chaos-store"
QUORUM_NAMESPACE = "taskherd-chaos-quorum"
ALL_NAMESPACES = (SERVICES_NAMESPACE, STORE_NAMESPACE, QUORUM_NAMESPACE)
MAIN_COMPONENTS = ("redis", "rabbitmq", "postgres")

Log = Callable[[str], None]


@dataclass(frozen=True)
class Side:
    """The services as one side reaches them: `pods` (Service names) or `host` (port-forwards)."""

    main: Endpoints
    store: Endpoints
    quorum: Endpoints | None


@dataclass(frozen=True)
class Services:
    main: deploy.Deployed
    store: deploy.Deployed
    quorum: deploy.Deployed | None
    host: Side

    @property
    def pods(self) -> Side:
        return Side(main=self.main.pods, store=self.store.pods, quorum=self.quorum.pods if self.quorum else None)

    def namespace_of(self, service: str) -> str:
        """The namespace holding a role's pods: broker/postgres/counter in main, store apart."""
        return {"store": STORE_NAMESPACE, "quorum": QUORUM_NAMESPACE}.get(service, SERVICES_NAMESPACE)


@contextlib.contextmanager
def services(cluster: clusters.Cluster, *, quorum: bool, log: Log) -> Iterator[Services]:
    """Deploys (or repairs) the chaos services and yields them, reached from this host through
    port-forwards that live as long as the block."""
    main = deploy.up(cluster, namespace=SERVICES_NAMESPACE, components=MAIN_COMPONENTS, rabbitmq_nodes=1, log=log)
    store = deploy.up(cluster, namespace=STORE_NAMESPACE, components=("redis",), log=log)
    rabbit_cluster = (deploy.up(cluster, namespace=QUORUM_NAMESPACE, components=("rabbitmq",), rabbitmq_nodes=3,
                                log=log) if quorum else None)
    with contextlib.ExitStack() as stack:
        host_main = stack.enter_context(access.reach(cluster, main, log=log))
        host_store = stack.enter_context(access.reach(cluster, store, log=log))
        host_quorum = stack.enter_context(access.reach(cluster, rabbit_cluster, log=log)) if rabbit_cluster else None
        yield Services(main=main, store=store, quorum=rabbit_cluster,
                       host=Side(main=host_main, store=host_store, quorum=host_quorum))


def down(cluster: clusters.Cluster, log: Log) -> None:
    for namespace in ALL_NAMESPACES:
        deploy.down(cluster, namespace=namespace, log=log)


# --- one app's corner ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Urls:
    """What the ledger app uses, from one side."""

    broker: str
    management: str | None  #: RabbitMQ management API (the operator reads depth and age there)
    delivery_counter: str
    database: str
    store: str


@dataclass(frozen=True)
class Tenancy:
    """One app's vhost, database and Redis databases, from both sides."""

    owner: str
    broker: str  #: "redis" or "rabbitmq"
    quorum: bool
    redis_db: int
    store_db: int
    vhost: str
    database: str
    host: Urls
    pods: Urls

    @property
    def queue_type(self) -> str:
        return "quorum" if self.quorum else "classic"


def _urls(side: Side, broker: str, quorum: bool, redis_db: int, store_db: int, vhost: str, database: str) -> Urls:
    rabbit = side.quorum if quorum else side.main
    counter = side.main.redis_db(redis_db)
    return Urls(broker=counter if broker == "redis" else rabbit.amqp_vhost(vhost),
                management=None if broker == "redis" else rabbit.management,
                delivery_counter=counter, database=side.main.database(database),
                store=side.store.redis_db(store_db))


def claim(services: Services, *, owner: str, broker: str, quorum: bool = False) -> Tenancy:
    """A fresh corner for the app named `owner` (a namespace name): empty vhost, database and Redis
    databases."""
    if quorum and (broker != "rabbitmq" or services.quorum is None):
        raise ValueError(f"quorum queues need broker=rabbitmq and the RabbitMQ cluster deployed "
                         f"(broker={broker!r}, cluster {'up' if services.quorum else 'not deployed'})")
    host = services.host
    redis_db, _ = tenants.lease_redis_database(host.main.redis_db(0), owner, flush=True)
    store_db, _ = tenants.lease_redis_database(host.store.redis_db(0), owner, flush=True)
    vhost, database = owner, owner.replace("-", "_")
    if broker == "rabbitmq":
        tenants.fresh_vhost((host.quorum if quorum else host.main).management, vhost)
    tenants.fresh_database(host.main.postgres, database)
    durable_commits(host.main.postgres, database)
    args = dict(broker=broker, quorum=quorum, redis_db=redis_db, store_db=store_db, vhost=vhost, database=database)
    return Tenancy(owner=owner, **args, host=_urls(host, **args), pods=_urls(services.pods, **args))


def durable_commits(postgres_url: str, database: str) -> None:
    """Every session on the app's database commits durably, whatever the server's default.

    With synchronous_commit=off on a server (a tuning some production databases carry), a commit
    returns while its WAL record is still in the server's shared memory: a crash of the server —
    the postgres-restart fault — loses it. The effect row and its idempotency key vanish together
    while the task's message was acknowledged: a lost task. The ledger must not depend on the
    server's setting."""
    import psycopg

    with psycopg.connect(f"{postgres_url}/postgres", autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{database}" SET synchronous_commit TO on')


def release(services: Services, tenancy: Tenancy) -> None:
    host = services.host
    tenants.release_redis_database(host.main.redis_db(0), tenancy.owner)
    tenants.release_redis_database(host.store.redis_db(0), tenancy.owner)
    if tenancy.broker == "rabbitmq":
        tenants.delete_vhost((host.quorum if tenancy.quorum else host.main).management, tenancy.vhost)
    tenants.drop_database(host.main.postgres, tenancy.database)
