"""Changes to the app while it works: a rolling `helm upgrade` (new image tag, new configuration),
and the operator scaling the pool down while some workers are busy."""
from __future__ import annotations

import copy
import time
from typing import Any, Mapping

from e2e.lib.waiting import wait_for

from ..deploy import upgrade, worker_deployment
from ..images import chart_image, tag_on_every_node
from . import Action, ActionError, Context, Injection, one_of, seconds, wait_workers_ready

#: the tag the upgrade moves to: the same image under a new name, as a CI pipeline pushes one
UPGRADE_TAG = "chaos-upgrade"


class HelmUpgrade(Action):
    """`helm upgrade` of the release under load: the worker image moves to a new tag (same bits) and
    the configuration changes (an environment variable, maxTasksPerChild), so every worker pod is
    replaced by a rolling update (maxUnavailable 0: new pods Ready before old ones drain)."""

    name = "helm-upgrade"
    targets = ("release",)
    params = {"image": one_of(True, False), "rolloutSeconds": seconds(30, 900)}

    def inject(self, ctx: Context, target: str, params: Mapping[str, Any]) -> Injection:
        release = ctx.release
        values = copy.deepcopy(release.values)
        [pool] = [p for p in values["workerPools"] if p["name"] == release.pool["name"]]
        before = worker_deployment(release)
        generation = before["metadata"]["generation"]
        image = before["spec"]["template"]["spec"]["containers"][0]["image"]
        changes = []
        if params.get("image", True):
            repository = image.rsplit(":", 1)[0]
            tag_on_every_node(ctx.cluster, image, f"{repository}:{UPGRADE_TAG}")
            pool["image"] = chart_image(repository, UPGRADE_TAG)
            changes.append(f"image {image} -> {repository}:{UPGRADE_TAG}")
        stamp = str(int(time.time()))
        pool["env"] = [e for e in pool["env"] if e["name"] != "LEDGER_RELEASE"] + [{"name": "LEDGER_RELEASE",
                                                                                      "value": stamp}]
        pool["maxTasksPerChild"] = 400 if pool.get("maxTasksPerChild") != 400 else 450
        changes.append(f"env LEDGER_RELEASE={stamp}, maxTasksPerChild={pool['maxTasksPerChild']}")
        ready_before = len(ctx.observer.latest.ready_workers())
        upgraded = upgrade(release, values, ctx.run_dir)
        evidence: dict[str, Any] = {"changes": changes, "ready_before": ready_before}

        def recover() -> None:
            timeout = params.get("rolloutSeconds", 300)
            ctx.cluster.kubectl("-n", ctx.namespace, "rollout", "status",
                                f"deployment/{before['metadata']['name']}", f"--timeout={timeout}s",
                                timeout=timeout + 30)
            after = worker_deployment(upgraded)
            if after["metadata"]["generation"] <= generation:
                raise ActionError("helm upgrade did not change the worker Deployment's template")
            wait_workers_ready(ctx, "every worker of the new revision Ready", 120)
            evidence["generation"] = (generation, after["metadata"]["generation"])
            ctx.release = upgraded

        return Injection("helm upgrade: " + "; ".join(changes), recover, evidence)


class OperatorScaleDown(Action):
    """Nothing is broken: the operator removes workers while the trickle keeps some of them busy.
    Its promise is tested: idle workers go first (pod-deletion-cost), a busy one only when every
    remaining worker is busy, and a busy one removed drains its tasks (preStop) instead of cutting
    them. The fault window lasts until the pool is back at minReplicas."""

    name = "operator-scale-down"
    targets = ("pool",)
    params = {"within": seconds(30, 600)}

    def inject(self, ctx: Context, target: str, params: Mapping[str, Any]) -> Injection:
        snap = ctx.observer.latest
        replicas, desired = len(snap.live_workers()), snap.pool_status.get("desiredReplicas")
        minimum = ctx.release.min_replicas
        evidence: dict[str, Any] = {"replicas_at_start": replicas, "desired_at_start": desired}

        def recover() -> None:
            wait_for(f"the pool back at minReplicas {minimum}", lambda: len(ctx.observer.wait_tick().live_workers()),
                     params.get("within", 240), 1, equals=minimum)
            evidence["replicas_at_end"] = minimum

        return Injection(f"the operator scales down from {replicas} worker(s) (desired {desired}) under load",
                         recover, evidence)
