"""Operator settings, in one place: environment variables, overridable by `python -m taskherd.operator` flags."""
from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field

from .worker_contract import OPERATOR_METRICS_PORT, WORKER_METRICS_PORT


def _namespaces(value: str | None) -> list[str]:
    return [n.strip() for n in (value or "").split(",") if n.strip()]


def _flag(value: str) -> bool:
    return value.strip().lower() not in ("0", "false", "no", "")


@dataclass(kw_only=True)
class OperatorConfig:
    #: namespaces to watch (TASKHERD_WATCH_NAMESPACES, comma separated); empty = the operator's own.
    namespaces: list[str] = field(default_factory=list)
    #: namespace of the leader Lease (POD_NAMESPACE, set by the chart from the downward API).
    lease_namespace: str = "default"
    lease_name: str = "taskherd-operator"
    identity: str = field(default_factory=lambda: f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}")
    #: False = standalone (a single replica, no Lease).
    leader_election: bool = True
    #: port of the operator's /metrics; 0 disables.
    metrics_port: int = OPERATOR_METRICS_PORT
    #: kopf's liveness endpoint.
    liveness_endpoint: str | None = "http://0.0.0.0:8080/healthz"
    #: Alertmanager used when a WorkerPool names no alert target.
    default_alertmanager_url: str | None = None
    #: port of the workers' metrics (taskherd_tasks_in_flight).
    worker_metrics_port: int = WORKER_METRICS_PORT
    #: log every write (scale, annotation, status, Event, page) as `**DRY-RUN**: would …` instead
    #: of making it; implies no leader election (taking the Lease is a write too).
    dry_run: bool = False

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "OperatorConfig":
        env = dict(os.environ if env is None else env)
        own = env.get("POD_NAMESPACE") or "default"
        return cls(
            namespaces=_namespaces(env.get("TASKHERD_WATCH_NAMESPACES")) or [own],
            lease_namespace=own,
            lease_name=env.get("TASKHERD_LEASE_NAME", "taskherd-operator"),
            leader_election=_flag(env.get("TASKHERD_LEADER_ELECTION", "true")),
            metrics_port=int(env.get("TASKHERD_OPERATOR_METRICS_PORT", OPERATOR_METRICS_PORT)),
            liveness_endpoint=env.get("TASKHERD_LIVENESS_ENDPOINT", "http://0.0.0.0:8080/healthz") or None,
            default_alertmanager_url=env.get("TASKHERD_ALERTMANAGER_URL") or None,
            worker_metrics_port=int(env.get("TASKHERD_WORKER_METRICS_PORT", WORKER_METRICS_PORT)),
            dry_run=_flag(env.get("TASKHERD_DRY_RUN", "false")),
        )
