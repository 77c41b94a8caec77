"""kopf wiring only: settings, the WorkerPool watch feeding the scheduler, health. No decisions here."""
from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

import kopf

from . import kube
from .alerts import DryRunPoster, HttpPoster
from .broker import BrokerObserver
from .busyness import READING_SAMPLES, MetricsBusynessReader, WorkerMetrics
from .child_deaths import DEATH_SAMPLES, MetricsChildDeathReader
from .config import OperatorConfig
from .leader import AlwaysLeader, LeaderElector
from .metrics import OperatorMetrics
from .poll import Deps
from .scheduler import PoolScheduler

#: set by __main__ before kopf starts; from the environment otherwise (`kopf run -m ...`).
CONFIG: OperatorConfig | None = None


@functools.cache
def _metrics() -> OperatorMetrics:
    """One set per process: kopf may start more than once in a process (kopf.testing.KopfRunner)."""
    return OperatorMetrics()


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
    config = CONFIG or OperatorConfig.from_env()
    settings.peering.standalone = True      # leader election is our Lease (see leader.py)
    settings.scanning.disabled = True       # namespaced: no cluster-wide discovery of namespaces/CRDs
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    await kube.load_config()
    api = kube.ApiKube()
    metrics = _metrics()
    if config.metrics_port:
        from prometheus_client import start_http_server
        start_http_server(config.metrics_port)
    elector = (LeaderElector(namespace=config.lease_namespace, name=config.lease_name, identity=config.identity,
                             api=api.api) if config.leader_election and not config.dry_run else AlwaysLeader())
    writer = kube.DryRunKube(api) if config.dry_run else api
    # One request per pod and poll, for the few series the two readers use.
    worker_metrics = WorkerMetrics(port=config.worker_metrics_port, names=READING_SAMPLES + DEATH_SAMPLES)
    observer = BrokerObserver(kube=api)
    deps = Deps(kube=writer, observe=observer,
                busyness=MetricsBusynessReader(worker_metrics),
                child_deaths=MetricsChildDeathReader(worker_metrics),
                poster=DryRunPoster() if config.dry_run else HttpPoster(), metrics=metrics,
                default_alertmanager_url=config.default_alertmanager_url)
    memo.api, memo.elector = api, elector
    memo.loop = asyncio.get_running_loop()  # where a deleted pool's metric series are removed
    # A dry run scales nothing, so a backlog would outgrow its pool at every count: it keeps the
    # regular polls (and their one log line each).
    memo.scheduler = PoolScheduler(deps=deps, is_leading=lambda: elector.is_leading,
                                   ready_counts=None if config.dry_run else observer.ready_counts)
    memo.tasks = [asyncio.create_task(elector.run()), asyncio.create_task(memo.scheduler.run())]
    logger.info("taskherd operator %s watching %s (leader election %s%s)", config.identity, config.namespaces,
                "on" if isinstance(elector, LeaderElector) else "off", ", DRY RUN" if config.dry_run else "")


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    for task in getattr(memo, "tasks", []):
        task.cancel()
    if hasattr(memo, "elector"):
        await memo.elector.release()
    if hasattr(memo, "api"):
        await memo.api.close()


@kopf.on.event("taskherd.io", "v1alpha1", "workerpools")
def workerpool_event(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    scheduler: PoolScheduler = memo.scheduler
    if type == "DELETED":
        scheduler.remove(body.metadata.namespace, body.metadata.name)
        # Its metric series go too (stale lines on dashboards otherwise). This sync handler runs in
        # kopf's thread pool: the removal is done on the event loop, after the step running there
        # (a poll of the pool that remove() cancelled may be recording its last figures).
        forget = functools.partial(scheduler.deps.metrics.forget_pool, body.metadata.namespace, body.metadata.name)
        loop = getattr(memo, "loop", None)
        if loop is not None and loop.is_running():
            loop.call_soon_threadsafe(forget)
        else:
            forget()
    else:
        scheduler.upsert(body)


@kopf.on.probe(id="leader")
def leader_probe(memo: kopf.Memo, **_: Any) -> bool:
    return bool(memo.elector.is_leading)


@kopf.on.probe(id="pools")
def pools_probe(memo: kopf.Memo, **_: Any) -> int:
    return len(memo.scheduler.pools)
