"""Faults on what the workers depend on: a broker, a RabbitMQ cluster node or PostgreSQL restarted
(crashed: SIGKILL of the server, the container restarts on its volume), and the dead-letter queue
made unwritable for a while."""
from __future__ import annotations

import time
from typing import Any, Mapping
from urllib.parse import quote, urlsplit

import httpx
import redis

from e2e.services import faults as service_faults

from ..deploy import ledger_modules
from ..world import QUORUM_NAMESPACE, SERVICES_NAMESPACE, STORE_NAMESPACE
from . import Action, ActionError, Context, Injection, count


class RestartService(Action):
    """The server process is SIGKILLed inside its container (e2e.services.faults.crash_container);
    the kubelet restarts the container on the same volume: Redis replays its AOF (everysec),
    RabbitMQ recovers its durable queues and persistent messages, PostgreSQL its WAL."""

    name = "restart-service"
    targets = ("broker", "broker-node", "postgres", "store")

    def inject(self, ctx: Context, target: str, params: Mapping[str, Any]) -> Injection:
        component, index, namespace = self._where(ctx, target)
        seconds = service_faults.crash_container(ctx.cluster, component, pod_index=index, namespace=namespace,
                                                 log=ctx.log)
        return Injection(f"{namespace}/{component}-{index} crashed (SIGKILL) and restarted: Ready again after "
                         f"{seconds:.1f}s", None, {"pod": f"{namespace}/{component}-{index}", "down_seconds": seconds})

    def _where(self, ctx: Context, target: str) -> tuple[str, int, str]:
        tenancy = ctx.release.tenancy
        if target == "postgres":
            return "postgres", 0, SERVICES_NAMESPACE
        if target == "store":
            return "redis", 0, STORE_NAMESPACE
        if target == "broker" and tenancy.broker == "redis":
            return "redis", 0, SERVICES_NAMESPACE
        if target == "broker":
            return "rabbitmq", 0, QUORUM_NAMESPACE if tenancy.quorum else SERVICES_NAMESPACE
        if not tenancy.quorum:
            raise ActionError("broker-node needs the RabbitMQ cluster (quorum queues): this release uses one node")
        return "rabbitmq", quorum_leader_index(ctx), QUORUM_NAMESPACE


def quorum_leader_index(ctx: Context) -> int:
    """Which RabbitMQ pod leads the ledger's quorum queue (`rabbit@rabbitmq-<i>.rabbitmq-nodes…`)."""
    app, _ = ledger_modules()
    urls = ctx.release.tenancy.host
    info = _management(urls.management).get(f"/api/queues/{quote(ctx.release.tenancy.vhost, safe='')}/{app.QUEUE}")
    info.raise_for_status()
    leader = info.json().get("leader") or ""
    host = leader.partition("@")[2].split(".")[0]
    if not host.startswith("rabbitmq-"):
        raise ActionError(f"the ledger queue's leader {leader!r} is not a rabbitmq-<i> pod")
    return int(host.rsplit("-", 1)[1])


def _management(url: str) -> httpx.Client:
    parts = urlsplit(url)
    return httpx.Client(base_url=f"{parts.scheme}://{parts.hostname}:{parts.port}",
                        auth=(parts.username, parts.password), timeout=30)


#: RabbitMQ: the policy that makes the DLQ refuse every publish (with confirms: a nack)
_POLICY = "chaos-dead-letter-queue-unwritable"
#: Redis: where the DLQ's entries wait while a string of that name makes LPUSH fail (WRONGTYPE)
_ASIDE = "{dlq}.chaos-aside"
# One atomic step, so that no envelope pushed in between can be overwritten by the rename back.
_REDIS_BLOCK = """
if redis.call('exists', KEYS[1]) == 1 then redis.call('rename', KEYS[1], KEYS[2]) end
redis.call('set', KEYS[1], 'unwritable: the chaos suite holds this dead-letter queue')
return 1
"""
_REDIS_UNBLOCK = """
redis.call('del', KEYS[1])
if redis.call('exists', KEYS[2]) == 1 then redis.call('rename', KEYS[2], KEYS[1]) end
return 1
"""


class DeadLetterQueueUnwritable(Action):
    """Every publish to the DLQ fails for the fault's duration — Redis: the list set aside and a
    string put in its place (LPUSH answers WRONGTYPE); RabbitMQ: a `reject-publish` policy whose
    max-length is the DLQ's depth at that moment (the publisher confirm is a nack) — while poison
    tasks fail. They must be put back, not acked nor lost, and land in the DLQ once it is writable
    again."""

    name = "dlq-unwritable"
    targets = ("dead-letter-queue",)
    params = {"poison": count(1, 5)}

    def inject(self, ctx: Context, target: str, params: Mapping[str, Any]) -> Injection:
        app, _ = ledger_modules()
        urls, dlq = ctx.release.tenancy.host, app.DEAD_LETTER_QUEUE
        if ctx.broker == "redis":
            client = redis.Redis.from_url(urls.broker, socket_timeout=10)
            client.eval(_REDIS_BLOCK, 2, dlq, _ASIDE.format(dlq=dlq))
            unblock = lambda: client.eval(_REDIS_UNBLOCK, 2, dlq, _ASIDE.format(dlq=dlq))  # noqa: E731
            how = f"Redis key {dlq} replaced by a string (LPUSH: WRONGTYPE)"
        else:
            vhost = quote(ctx.release.tenancy.vhost, safe="")
            api = _management(urls.management)
            # The limit is what the DLQ holds now (earlier scenarios' envelopes): nothing is dropped,
            # nothing more gets in.
            queue = api.get(f"/api/queues/{vhost}/{quote(dlq, safe='')}")
            queue.raise_for_status()
            depth = queue.json().get("messages", 0)
            api.put(f"/api/policies/{vhost}/{_POLICY}", json={
                "pattern": f"^{dlq.replace('.', '[.]')}$", "apply-to": "queues", "priority": 100,
                "definition": {"max-length": depth, "overflow": "reject-publish"}}).raise_for_status()
            unblock = lambda: api.delete(f"/api/policies/{vhost}/{_POLICY}").raise_for_status()  # noqa: E731
            how = f"policy {_POLICY} on {dlq}: max-length {depth} (its depth now), reject-publish"
        time.sleep(2)  # RabbitMQ applies a policy asynchronously
        tasks = ctx.poison("permanent", params.get("poison", 2))
        for task in tasks:
            ctx.producer.publish(task)
        return Injection(f"{how}; sent {len(tasks)} invalid task(s) {', '.join(t.key for t in tasks)}",
                         lambda: unblock() and None, {"keys": [t.key for t in tasks], "how": how})
