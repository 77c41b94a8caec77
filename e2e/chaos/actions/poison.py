"""Faults a task brings with it: a memory hog the kernel OOM-kills on every delivery, a task blocked
on a socket with no timeout, an invalid one. Each is published like any task; its fault is what
the worker meets when it runs it."""
from __future__ import annotations

from typing import Any, Mapping

from e2e.lib.waiting import wait_for

from ..ledger import UNAVAILABLE, dead_letters
from . import Action, Context, Injection, count, one_of

#: the hard limit ends a wedged task (30 s); an OOM poison runs MAX_DELIVERIES times, a few s each
DEAD_LETTERED_WITHIN_SECONDS = 150


class SendPoison(Action):
    name = "send-poison"
    targets = ("pool",)
    params = {"kind": one_of("oom", "socket-wedge", "permanent"), "count": count(1, 5)}

    def inject(self, ctx: Context, target: str, params: Mapping[str, Any]) -> Injection:
        kind, n = params.get("kind", "permanent"), params.get("count", 1)
        pods = ctx.observer.latest.ready_workers()
        before = {pod: ctx.cluster.oom_kills(ctx.namespace, pod) for pod in pods} if kind == "oom" else {}
        tasks = ctx.poison(kind, n)
        for task in tasks:
            ctx.producer.publish(task)
        keys = {t.key for t in tasks}
        evidence: dict[str, Any] = {"kind": kind, "keys": sorted(keys)}

        def recover() -> None:
            wait_for(f"the {kind} poison {sorted(keys)} in the dead-letter queue",
                     lambda: keys <= {d.key for d in dead_letters(ctx.release)}, DEAD_LETTERED_WITHIN_SECONDS, 2,
                     ignoring=UNAVAILABLE)
            if kind == "oom":
                after = {pod: ctx.cluster.oom_kills(ctx.namespace, pod) for pod in before}
                evidence["oom_kills"] = {pod: (before[pod], after[pod]) for pod in before}
                terminated = [f"{p['metadata']['name']}/{c['name']}" for p in ctx.observer.latest.workers
                              for c in (p.get("status") or {}).get("containerStatuses") or []
                              if ((c.get("lastState") or {}).get("terminated") or {}).get("reason") == "OOMKilled"]
                evidence["oom_killed_containers"] = terminated

        return Injection(f"sent {n} {kind} poison task(s): {', '.join(sorted(keys))}", recover, evidence)
