"""Faults on pods: a container's main process signalled from its node, a pod force-deleted."""
from __future__ import annotations

import signal
import time
from typing import Any, Mapping

from e2e.lib.waiting import wait_for
from taskherd.operator.pause import PAUSED_REPLICAS

from ..observe import restarts
from . import Action, ActionError, Context, Injection, busiest_worker, count, one_of, seconds, wait_workers_ready

#: liveness: heartbeat stale after 30 s, then 3 failures 10 s apart, then the 15 s liveness grace
STOPPED_WORKER_RESTART_SECONDS = 120


def _restart_counts(ctx: Context, pods: list[str]) -> dict[str, int]:
    out = {}
    for pod in pods:
        out[pod] = restarts(ctx.cluster.kubectl_json("-n", ctx.namespace, "get", "pod", pod))
    return out


class KillProcess(Action):
    """`kill -<signal>` of the target container's main process, from its node. SIGKILL: the worker
    (or operator) dies at once, mid-task; SIGSTOP: it freezes — heartbeat stale, liveness restarts it."""

    name = "kill-process"
    targets = ("busiest-worker", "operator-leader")
    params = {"signal": one_of("KILL", "STOP"), "count": count(1, 5), "every": seconds(1, 60)}

    def inject(self, ctx: Context, target: str, params: Mapping[str, Any]) -> Injection:
        signum = signal.Signals[f"SIG{params.get('signal', 'KILL')}"]
        hits: list[dict] = []
        # A killed worker is not Ready while its container restarts (a second kill in a row meets
        # the kubelet's restart back-off), a frozen one stops reporting: either way the operator's
        # scale-down may remove the pod before it is back (a fine end for the pool, but not what
        # this fault tests, and CI once saw exactly that). The pool is held at its size until the
        # hit workers are back.
        hold = target == "busiest-worker"
        if hold:
            # Never below the pods that exist: a smaller Deployment would pick the unready (killed)
            # pod first for removal; never below what the pool asks for: a scale-up in flight ends.
            latest = ctx.observer.latest
            _hold_pool(ctx, max(len(latest.live_workers()), latest.pool_status.get("desiredReplicas") or 0))
        for i in range(params.get("count", 1)):
            if i:
                time.sleep(params.get("every", 8))
            pod = busiest_worker(ctx) if target == "busiest-worker" else self._leader(ctx)
            before = _restart_counts(ctx, [pod])[pod]
            process = ctx.nodes.main_process(ctx.namespace, pod)
            ctx.nodes.signal(process, signum)
            holder = ctx.observer.latest.lease_holder
            hits.append({"pod": pod, "at": time.time(), "restarts_before": before, "lease_holder": holder,
                         "in_flight": ctx.observer.latest.in_flight.get(pod, 0), "node": process.node})
        evidence: dict[str, Any] = {"signal": signum.name, "hits": hits}

        def recover() -> None:
            try:
                restarted()
            finally:
                if hold:
                    _hold_pool(ctx, None)

        def restarted() -> None:
            timeout = STOPPED_WORKER_RESTART_SECONDS if signum is signal.SIGSTOP else 90
            for hit in hits:
                pod = hit["pod"]
                seen = ctx.cluster.wait(f"{pod}'s container restarted after {signum.name}",
                                lambda p=pod: _restart_counts(ctx, [p])[p], timeout, 1,
                                until=lambda n, b=hit["restarts_before"]: n > b)
                hit["restarts_after"] = seen
            if target == "operator-leader":
                first = hits[0]["lease_holder"]
                evidence["new_lease_holder"] = wait_for(
                    "another operator to hold the Lease", lambda: ctx.observer.wait_tick().lease_holder, 90, 1,
                    until=lambda holder: holder and holder != first)
            else:
                wait_workers_ready(ctx, "every worker Ready again", timeout)

        return Injection(f"{signum.name} to the main process of "
                         + ", ".join(f"{h['pod']} ({h['in_flight']} task(s) running)" for h in hits),
                         recover, evidence)

    @staticmethod
    def _leader(ctx: Context) -> str:
        pod = wait_for("the operator pod holding the Lease", lambda: ctx.observer.wait_tick().leader_pod(), 60, 1)
        if pod is None:
            raise ActionError(f"no operator holds the Lease in {ctx.namespace}")
        return pod


def _hold_pool(ctx: Context, replicas: int | None) -> None:
    """Pause the WorkerPool at `replicas` (the operator's taskherd.io/paused-replicas), or resume it."""
    annotation = PAUSED_REPLICAS + (f"={replicas}" if replicas is not None else "-")
    ctx.cluster.kubectl("-n", ctx.namespace, "annotate", "workerpools", "--all", annotation, "--overwrite")


class DeletePod(Action):
    """`kubectl delete pod --grace-period=0 --force` of the target: the API object goes at once, the
    ReplicaSet replaces it; on the node the kubelet still stops the container (preStop, SIGTERM)."""

    name = "delete-pod"
    targets = ("busiest-worker",)
    params = {"count": count(1, 5), "every": seconds(1, 60)}

    def inject(self, ctx: Context, target: str, params: Mapping[str, Any]) -> Injection:
        hits = []
        for i in range(params.get("count", 1)):
            if i:
                time.sleep(params.get("every", 8))
            pod = busiest_worker(ctx)
            in_flight = ctx.observer.latest.in_flight.get(pod, 0)
            ctx.observer.mark_killed(pod)
            ctx.cluster.kubectl("-n", ctx.namespace, "delete", "pod", pod, "--grace-period=0", "--force",
                                "--wait=false")
            hits.append({"pod": pod, "at": time.time(), "in_flight": in_flight})

        def recover() -> None:
            gone = {h["pod"] for h in hits}
            wait_for("the force-deleted pods gone and replaced",
                     lambda: not gone & {p["metadata"]["name"] for p in ctx.observer.wait_tick().workers}, 90, 1)
            wait_workers_ready(ctx, "every worker Ready again", 120)

        return Injection("force-deleted " + ", ".join(f"{h['pod']} ({h['in_flight']} task(s) running)" for h in hits),
                         recover, {"hits": hits})
