"""The operator's own Prometheus metrics: decisions, poll latency, errors and pages per WorkerPool,
whether this replica leads, and the versions that run."""
from __future__ import annotations

import platform
from importlib import metadata

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

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
