"""`python -m e2e.services COMMAND`: the in-cluster services on the cluster the e2e suite resolves
(TASKHERD_KUBECONFIG/KUBECONFIG, else kind, else the local cluster).

  up [--rabbitmq-nodes N] [--prometheus-namespace NS]... [--components a,b]
                  deploy or repair them and wait until ready (settings not given keep what runs)
  down            remove them (namespace, volumes, Prometheus' ClusterRole)
  status          what runs, and the URLs pods use
  urls            the URLs pods use, as NAME=URL lines
  forward         tunnel every service to 127.0.0.1 (through the API server) and print the URLs
                  this host uses, until interrupted
  redis-db OWNER [--release]   lease (or release) a Redis database of OWNER's own; prints its URL
  vhost NAME [--drop]      a fresh RabbitMQ vhost (an existing one is emptied); prints its AMQP URL
  database NAME [--drop]   a fresh PostgreSQL database (an existing one is dropped); prints its URL

Exit status 0 on success, 1 with the reason on stderr otherwise.
"""
from __future__ import annotations

import argparse
import sys
import threading

from e2e.lib import cluster as clusters

from . import access, deploy, tenants
from .config import COMPONENTS, NAMESPACE, SettingsError
from .endpoints import Endpoints
from .forward import ForwardError
from .image import ImageError


def say(text: str) -> None:
    print(f"[services] {text}", file=sys.stderr, flush=True)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m e2e.services", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--namespace", default=NAMESPACE, help=f"default {NAMESPACE}")
    sub = p.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="deploy or repair, wait until ready")
    up.add_argument("--rabbitmq-nodes", type=int, help="1 (default on a fresh cluster), 3 or 5")
    up.add_argument("--prometheus-namespace", action="append", dest="prometheus_namespaces",
                    help="a namespace whose pods Prometheus scrapes (repeat; none given: every namespace)")
    up.add_argument("--components", type=lambda s: tuple(x for x in s.split(",") if x),
                    help=f"comma-separated subset of {','.join(COMPONENTS)}")
    sub.add_parser("down", help="remove them")
    sub.add_parser("status", help="what runs")
    sub.add_parser("urls", help="the URLs pods use")
    sub.add_parser("forward", help="tunnel them to this host until interrupted")
    lease = sub.add_parser("redis-db", help="a Redis database of one's own")
    lease.add_argument("owner")
    lease.add_argument("--release", action="store_true", help="flush and give it back")
    vhost = sub.add_parser("vhost", help="a fresh RabbitMQ vhost")
    vhost.add_argument("name")
    vhost.add_argument("--drop", action="store_true", help="delete it with its queues instead")
    database = sub.add_parser("database", help="a fresh PostgreSQL database")
    database.add_argument("name")
    database.add_argument("--drop", action="store_true", help="drop it instead")
    return p.parse_args(argv)


def _deployed(cluster: clusters.Cluster, namespace: str) -> deploy.Deployed:
    deployed = deploy.current(cluster, namespace)
    if deployed is None:
        raise deploy.ServicesError(f"no services in namespace {namespace}: `python -m e2e.services up`")
    return deployed


def _print_urls(endpoints: Endpoints) -> None:
    for name in ("redis", "amqp", "management", "postgres", "alertmanager", "prometheus"):
        value = getattr(endpoints, name)
        if value is not None:
            print(f"{name.upper()}_URL={value}")


def _with_host(cluster: clusters.Cluster, namespace: str, action) -> None:
    deployed = _deployed(cluster, namespace)
    with access.reach(cluster, deployed, log=say) as host:
        action(deployed, host)


def run(args: argparse.Namespace) -> None:
    cluster = clusters.resolve()
    cluster.check_reachable()
    ns = args.namespace
    if args.command == "up":
        deployed = deploy.up(cluster, namespace=ns, log=say, rabbitmq_nodes=args.rabbitmq_nodes,
                             prometheus_namespaces=args.prometheus_namespaces and tuple(args.prometheus_namespaces),
                             components=args.components)
        _print_urls(deployed.pods)
    elif args.command == "down":
        deploy.down(cluster, namespace=ns, log=say)
    elif args.command == "status":
        deployed = _deployed(cluster, ns)
        say(f"namespace {ns}: RabbitMQ nodes {deployed.settings.rabbitmq_nodes}, Prometheus watches "
            f"{', '.join(deployed.settings.prometheus_namespaces) or 'every namespace'}")
        for state in deploy.rollouts(cluster, deployed.settings.components, ns):
            print(f"{state.component:<13} {state.summary}")
        _print_urls(deployed.pods)
    elif args.command == "urls":
        _print_urls(_deployed(cluster, ns).pods)
    elif args.command == "forward":
        def hold(_deployed, host: Endpoints) -> None:
            _print_urls(host)
            sys.stdout.flush()
            say("forwarding until interrupted (Ctrl-C)")
            try:
                threading.Event().wait()
            except KeyboardInterrupt:
                pass
        _with_host(cluster, ns, hold)
    elif args.command == "redis-db":
        def lease(deployed: deploy.Deployed, host: Endpoints) -> None:
            if args.release:
                index = tenants.release_redis_database(host.redis_db(0), args.owner)
                say(f"released Redis database {index} of {args.owner}" if index is not None
                    else f"{args.owner} held no Redis database")
                return
            index, fresh = tenants.lease_redis_database(host.redis_db(0), args.owner)
            say(f"Redis database {index} is {args.owner}'s ({'new, empty' if fresh else 'already held'})")
            print(deployed.pods.redis_db(index))
        _with_host(cluster, ns, lease)
    elif args.command == "vhost":
        def vhost(deployed: deploy.Deployed, host: Endpoints) -> None:
            if args.drop:
                gone = tenants.delete_vhost(host.management, args.name)
                say(f"vhost {args.name} {'deleted' if gone else 'did not exist'}")
                return
            tenants.fresh_vhost(host.management, args.name)
            print(deployed.pods.amqp_vhost(args.name))
        _with_host(cluster, ns, vhost)
    elif args.command == "database":
        def database(deployed: deploy.Deployed, host: Endpoints) -> None:
            if args.drop:
                tenants.drop_database(host.postgres, args.name)
                say(f"database {args.name} dropped")
                return
            tenants.fresh_database(host.postgres, args.name)
            print(deployed.pods.database(args.name))
        _with_host(cluster, ns, database)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        run(args)
    except (deploy.ServicesError, ImageError, SettingsError, tenants.TenantError, ForwardError,
            clusters.ClusterUnavailable,
            clusters.CommandFailed, clusters.WaitTimeout) as exc:
        print(f"python -m e2e.services {args.command}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
