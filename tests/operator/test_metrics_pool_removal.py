"""A deleted WorkerPool's metric series go with it, against the real prometheus_client registry:
every per-pool label set of the deleted pool (each labelled metric of the operator), and nothing
of the other pools or of the operator's own series."""
from __future__ import annotations

import asyncio

import kopf
from prometheus_client import CollectorRegistry

from fakes import make_deps
from taskherd.operator.handlers import workerpool_event
from taskherd.operator.metrics import POOL_LABELS, OperatorMetrics
from taskherd.operator.scheduler import PoolScheduler

POOLS = [("shop", "emails"), ("shop", "reports"), ("other", "emails")]


def record_everything(metrics: OperatorMetrics) -> None:
    for namespace, name in POOLS:
        metrics.decisions.labels(namespace, name, "up").inc()
        metrics.decisions.labels(namespace, name, "hold").inc(2)
        metrics.poll_seconds.labels(namespace, name).observe(0.02)
        metrics.errors.labels(namespace, name, "broker").inc()
        metrics.errors.labels(namespace, name, "status").inc()
        metrics.early_polls.labels(namespace, name).inc()
        metrics.pages.labels(namespace, name, "fire").inc()
    metrics.leader.set(1)


def pools_in(registry: CollectorRegistry) -> dict[tuple[str, str], set[str]]:
    """(namespace, workerpool) -> the metric families with a series of that pool."""
    found: dict[tuple[str, str], set[str]] = {}
    for family in registry.collect():
        for sample in family.samples:
            if "workerpool" in sample.labels:
                found.setdefault((sample.labels["namespace"], sample.labels["workerpool"]), set()).add(family.name)
    return found


def test_forgetting_a_pool_removes_each_of_its_series_and_only_its_own():
    registry = CollectorRegistry()
    metrics = OperatorMetrics(registry=registry)
    record_everything(metrics)
    every_family = pools_in(registry)[("shop", "emails")]
    assert len(every_family) == 5, every_family
    assert {m._name for m in metrics.per_pool()} >= {"taskherd_operator_poll_duration_seconds"}

    removed = metrics.forget_pool("shop", "emails")

    assert removed == 7  # up and hold, one histogram, two error kinds, one early poll, one page kind
    after = pools_in(registry)
    assert ("shop", "emails") not in after
    assert after[("shop", "reports")] == every_family and after[("other", "emails")] == every_family
    assert registry.get_sample_value("taskherd_operator_scale_decisions_total",
                                     {"namespace": "shop", "workerpool": "reports", "direction": "hold"}) == 2
    assert registry.get_sample_value("taskherd_operator_leader") == 1
    assert any(f.name == "taskherd_operator_build_info" and f.samples for f in registry.collect())
    assert metrics.forget_pool("shop", "emails") == 0, "a second deletion event finds nothing left"
    # a pool made again with the same name starts from zero
    metrics.errors.labels("shop", "emails", "broker").inc()
    assert registry.get_sample_value("taskherd_operator_errors_total",
                                     {"namespace": "shop", "workerpool": "emails", "kind": "broker"}) == 1


def test_every_labelled_metric_of_the_operator_is_per_pool_or_build_info():
    """A per-pool metric added later is forgotten with its pool without being listed anywhere."""
    metrics = OperatorMetrics(registry=CollectorRegistry())
    per_pool = metrics.per_pool()
    assert len(per_pool) == 5
    assert all(m._labelnames[:2] == POOL_LABELS for m in per_pool)


def test_the_deletion_event_removes_the_pools_series():
    deps = make_deps(None, None)  # neither the cluster nor the broker is asked
    scheduler = PoolScheduler(deps=deps, is_leading=lambda: True)
    record_everything(deps.metrics)
    memo = kopf.Memo()
    memo.scheduler = scheduler
    body = kopf.Body({"metadata": {"namespace": "shop", "name": "emails", "uid": "u"}, "spec": {}})

    workerpool_event(type="DELETED", body=body, memo=memo)

    assert set(pools_of(deps.metrics)) == {("shop", "reports"), ("other", "emails")}


def test_the_deletion_event_from_kopfs_thread_pool_removes_the_series_on_the_event_loop():
    deps = make_deps(None, None)  # neither the cluster nor the broker is asked
    scheduler = PoolScheduler(deps=deps, is_leading=lambda: True)
    record_everything(deps.metrics)
    body = kopf.Body({"metadata": {"namespace": "other", "name": "emails", "uid": "u"}, "spec": {}})

    async def main():
        memo = kopf.Memo()
        memo.scheduler, memo.loop = scheduler, asyncio.get_running_loop()
        # kopf runs a sync handler in its executor, as here
        await asyncio.get_running_loop().run_in_executor(None, lambda: workerpool_event(
            type="DELETED", body=body, memo=memo))
        await asyncio.sleep(0)  # the removal scheduled on the loop runs
        return set(pools_of(deps.metrics))

    assert asyncio.run(main()) == {("shop", "emails"), ("shop", "reports")}


def pools_of(metrics: OperatorMetrics) -> dict[tuple[str, str], set[str]]:
    """pools_in() of the registry the metrics were made in, read through each metric's collect()."""
    registry = CollectorRegistry()
    for metric in vars(metrics).values():
        if hasattr(metric, "collect"):
            registry.register(metric)
    return pools_in(registry)
