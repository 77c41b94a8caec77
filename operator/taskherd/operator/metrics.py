"""The operator's own Prometheus metrics (decisions, poll latency, errors, pages)."""
from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram


class OperatorMetrics:
    def __init__(self, *, registry: CollectorRegistry = REGISTRY) -> None:
        self.decisions = Counter(
            "taskherd_operator_scale_decisions_total",
            "Scaling decisions by direction (up, down, hold)", ["direction"], registry=registry)
        self.poll_seconds = Histogram(
            "taskherd_operator_poll_duration_seconds", "Time of one WorkerPool poll, observe to status",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), registry=registry)
        self.errors = Counter(
            "taskherd_operator_errors_total",
            "Errors by kind (spec, broker, scale, busyness, terminations, event, page, status, internal)", ["kind"], registry=registry)
        self.pages = Counter(
            "taskherd_operator_dead_letter_pages_total", "Dead-letter pages sent, by kind (fire, resend, resolve)",
            ["kind"], registry=registry)
