"""Faults on a node: its kubelet restarted, the node drained (the app's pods evicted through the
eviction API, which honours the PodDisruptionBudget), the node lost without warning."""
from __future__ import annotations

import time
from typing import Any, Mapping

from ..deploy import RELAY, WORKER_SELECTOR
from . import Action, ActionError, Context, Injection, seconds, wait_workers_ready, worker_node


class RestartKubelet(Action):
    """The kubelet of the node whose workers run the most tasks stops (SIGTERM) and starts again.
    Running containers are not the kubelet's children: they must keep running, and the node must
    come back Ready with its pods. On the local cluster this restarts the shared node's kubelet —
    the one fault allowed to — and restores it exactly as `make cluster` started it."""

    name = "restart-kubelet"
    targets = ("worker-node",)

    def inject(self, ctx: Context, target: str, params: Mapping[str, Any]) -> Injection:
        node = worker_node(ctx)
        seconds_taken = ctx.nodes.restart_kubelet(node)
        return Injection(f"kubelet on {node} restarted; node Ready again after {seconds_taken:.1f}s", None,
                         {"node": node, "ready_after_seconds": seconds_taken})


def _pods_on(ctx: Context, node: str) -> list[str]:
    return [p["metadata"]["name"] for p in ctx.observer.wait_tick().live_workers() if p["spec"].get("nodeName") == node]


def _fixture_nodes(ctx: Context) -> dict[str, str]:
    """node -> the suite's single-server service pods on it (brokers, PostgreSQL, the store). The
    3-node RabbitMQ of the quorum fault is left out: it spreads over every node by design, and
    losing one of its nodes is what quorum queues survive."""
    found: dict[str, list[str]] = {}
    for namespace in (ctx.services.main.namespace, ctx.services.store.namespace):
        for pod in ctx.cluster.kubectl_json("get", "pods", "-n", namespace)["items"]:
            node = pod["spec"].get("nodeName")
            if node:
                found.setdefault(node, []).append(f"{namespace}/{pod['metadata']['name']}")
    return {node: "runs the suite's services " + ", ".join(pods) for node, pods in found.items()}


def _need_two_nodes(ctx: Context, node: str) -> None:
    others = [n for n in ctx.cluster.ready_nodes() if n != node]
    schedulable = [n for n in others if not ctx.cluster.kubectl_json("get", "node", n)["spec"].get("unschedulable")]
    if not schedulable:
        raise ActionError(f"node {node} is the only schedulable node: its workers would have nowhere to go")


class DrainNode(Action):
    """`kubectl drain` of the node whose workers run the most tasks, limited to this app's pods
    (`--pod-selector`: the suite never evicts what it did not create). Evictions go through the
    eviction API, so the pool's PodDisruptionBudget (maxUnavailable 1) holds them back one at a
    time; each evicted worker drains its tasks (preStop) within its grace period."""

    name = "drain-node"
    targets = ("worker-node",)
    params = {"timeout": seconds(60, 900)}

    def inject(self, ctx: Context, target: str, params: Mapping[str, Any]) -> Injection:
        node = worker_node(ctx)
        _need_two_nodes(ctx, node)
        on_node = _pods_on(ctx, node)
        timeout = params.get("timeout", 300)
        started = time.monotonic()
        ctx.cluster.kubectl("cordon", node)
        output = ""
        for selector in (WORKER_SELECTOR, f"app.kubernetes.io/name={RELAY}"):
            r = ctx.cluster.kubectl("drain", node, f"--pod-selector={selector}", "--ignore-daemonsets",
                                    "--delete-emptydir-data", f"--timeout={int(timeout)}s", timeout=timeout + 30)
            output += r.stdout + r.stderr
        evidence: dict[str, Any] = {"node": node, "workers_on_node": on_node,
                                    "held_back_by_budget": output.count("disruption budget"),
                                    "drain_seconds": round(time.monotonic() - started, 1)}

        def recover() -> None:
            evidence["workers_left_on_node"] = _pods_on(ctx, node)
            ctx.cluster.kubectl("uncordon", node)
            wait_workers_ready(ctx, "every worker Ready after the drain", 180)

        return Injection(f"drained {node} of this app's pods ({', '.join(on_node)}); the budget held back "
                         f"{evidence['held_back_by_budget']} eviction(s)", recover, evidence)


class LoseNode(Action):
    """The node whose workers run the most tasks is lost: its kind container is SIGKILLed
    (e2e.lib.kind: no drain, no grace, nothing on it gets a signal it can handle). After the
    fault's duration the node is started again and must rejoin Ready."""

    name = "lose-node"
    targets = ("worker-node",)
    params = {"restoreSeconds": seconds(60, 600)}

    def inject(self, ctx: Context, target: str, params: Mapping[str, Any]) -> Injection:
        from e2e.lib import kind

        if ctx.cluster.source != "kind":
            raise ActionError(f"lose-node needs kind (a node is a container to kill), this is the "
                              f"{ctx.cluster.source} cluster")
        # A node that also runs the suite's brokers or database would make this a broker outage as
        # well (and a task blocked on its database meets its hard time limit): not the fault named.
        node = worker_node(ctx, avoid=_fixture_nodes(ctx))
        _need_two_nodes(ctx, node)
        on_node = _pods_on(ctx, node)
        kind.lose_node(node)

        def recover() -> None:
            kind.restore_node(ctx.cluster, node, timeout=params.get("restoreSeconds", 240))
            wait_workers_ready(ctx, "every worker Ready after the node came back", 240)

        return Injection(f"lost node {node} (container SIGKILLed) with workers {', '.join(on_node)}", recover,
                         {"node": node, "workers_on_node": on_node})
