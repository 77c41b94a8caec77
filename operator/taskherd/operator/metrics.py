"""The operator's own Prometheus metrics: decisions, poll latency, errors and pages per WorkerPool,
whether this replica leads, and the versions that run."""
from __future__ import annotations

import platform
from importlib import metadata

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

#: every per-pool metric carries the WorkerPool it is about, as kube-state-metrics labels objects
POOL_LABELS = ("namespace", "workerpool")


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "unknown"


class OperatorMetrics:
    def __init__(self, *, registry: CollectorRegistry = REGISTRY) -> None:
        self.decisions = Counter(
            "taskherd_operator_scale_decisions_total",
            "Scaling decisions by direction (up, down, hold)", [*POOL_LABELS, "direction"], registry=registry)
        self.poll_seconds = Histogram(
            "taskherd_operator_poll_duration_seconds", "Time of one WorkerPool poll, observe to status",
            POOL_LABELS, buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), registry=registry)
        self.errors = Counter(
            "taskherd_operator_errors_total",
            "Errors by kind (spec, broker, scale, busyness, terminations, event, page, status, internal)",
            [*POOL_LABELS, "kind"], registry=registry)
        self.early_polls = Counter(
            "taskherd_operator_early_polls_total",
            "Polls brought forward by the early notice: a pool's ready messages counted between "
            "polls outgrew its replicas", POOL_LABELS, registry=registry)
        self.pages = Counter(
            "taskherd_operator_dead_letter_pages_total", "Dead-letter pages sent, by kind (fire, resend, resolve)",
            [*POOL_LABELS, "kind"], registry=registry)
        self.leader = Gauge(
            "taskherd_operator_leader", "1 while this replica holds the leader Lease (only the leader polls)",
            registry=registry)
        self.build_info = Gauge(
            "taskherd_operator_build_info", "Versions of the operator, kopf and Python; always 1",
            ["version", "kopf", "python"], registry=registry)
        self.build_info.labels(_version("taskherd-operator"), _version("kopf"), platform.python_version()).set(1)

    def per_pool(self) -> list[MetricWrapperBase]:
        """Every metric labelled by WorkerPool (POOL_LABELS first): all the operator's labelled
        metrics but build_info, found rather than listed, so a metric added later is not missed."""
        return [metric for metric in vars(self).values()
                if isinstance(metric, MetricWrapperBase) and _label_names(metric)[:len(POOL_LABELS)] == POOL_LABELS]

    def forget_pool(self, namespace: str, name: str) -> int:
        """Removes every series of the WorkerPool ``namespace/name``, called when it is deleted: a
        dashboard would otherwise draw its last figures as a line that never ends, and every pool
        ever made would stay in each scrape. Returns how many label sets went. A pool made again
        with the same name starts from zero, as the counters of any new object do."""
        removed = 0
        for metric in self.per_pool():
            for labels in _label_sets(metric):
                if labels[:len(POOL_LABELS)] == (namespace, name):
                    try:
                        metric.remove(*labels)
                    except KeyError:  # removed meanwhile (a second deletion event of the pool)
                        continue
                    removed += 1
        return removed


def _label_names(metric: MetricWrapperBase) -> tuple[str, ...]:
    return tuple(getattr(metric, "_labelnames", ()))


def _label_sets(metric: MetricWrapperBase) -> list[tuple[str, ...]]:
    """The label values of each series of a labelled metric, read through collect() (a histogram's
    ``le`` and its _sum/_count samples folded into their series)."""
    names = _label_names(metric)
    return sorted({tuple(sample.labels[n] for n in names)
                   for family in metric.collect() for sample in family.samples
                   if all(n in sample.labels for n in names)})
