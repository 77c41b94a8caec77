"""Operator settings, in one place: the environment (read through taskherd.contract, which names the
variable, its value and the valid range when one is wrong), overridable by the flags of
`python -m taskherd.operator`."""
from __future__ import annotations

import logging
import os
import socket
import uuid
from dataclasses import dataclass, field

from taskherd import contract

logger = logging.getLogger(__name__)

#: the operator's variables of the contract (their parsers, ranges and defaults live there).
VARIABLES = ("TASKHERD_WATCH_NAMESPACES", "TASKHERD_LEASE_NAME", "TASKHERD_LEADER_ELECTION",
             "TASKHERD_OPERATOR_METRICS_PORT", "TASKHERD_OPERATOR_HEALTH_PORT", "TASKHERD_WORKER_METRICS_PORT",
             "TASKHERD_ALERTMANAGER_URL")


def health_endpoint(port: int) -> str | None:
    """kopf's liveness endpoint on every interface; 0 turns it off."""
    return f"http://0.0.0.0:{port}/healthz" if port else None


@dataclass(kw_only=True)
class OperatorConfig:
    #: namespaces to watch (TASKHERD_WATCH_NAMESPACES); empty = the operator's own.
    namespaces: list[str] = field(default_factory=list)
    #: namespace of the leader Lease (POD_NAMESPACE, set by the chart from the downward API).
    lease_namespace: str = "default"
    lease_name: str = "taskherd-operator"
    identity: str = field(default_factory=lambda: f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}")
    #: False = standalone (a single replica, no Lease).
    leader_election: bool = True
    #: port of the operator's /metrics; 0 disables.
    metrics_port: int = contract.OPERATOR_METRICS_PORT
    #: kopf's liveness endpoint; None disables.
    liveness_endpoint: str | None = health_endpoint(contract.OPERATOR_HEALTH_PORT)
    #: Alertmanager used when a WorkerPool names no alert target.
    default_alertmanager_url: str | None = None
    #: port of the workers' metrics (taskherd_tasks_in_flight).
    worker_metrics_port: int = contract.WORKER_METRICS_PORT
    #: log every write (scale, annotation, status, Event, page) as `**DRY-RUN**: would …` instead
    #: of making it; implies no leader election (taking the Lease is a write too).
    dry_run: bool = False

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "OperatorConfig":
        """Raises contract.ContractError naming every variable that is set to an invalid value."""
        env = dict(os.environ if env is None else env)
        values, problems = contract.read(VARIABLES, env)
        metrics_port, health_port = values["TASKHERD_OPERATOR_METRICS_PORT"], values["TASKHERD_OPERATOR_HEALTH_PORT"]
        if not problems and metrics_port and metrics_port == health_port:
            problems.append(f"TASKHERD_OPERATOR_METRICS_PORT and TASKHERD_OPERATOR_HEALTH_PORT are both {metrics_port}: "
                            f"two servers cannot listen on one port (valid: two different ports, or 0 to turn one off)")
        if problems:
            raise contract.ContractError(problems)
        for warning in contract.misspelled(env):
            logger.warning("taskherd operator: %s", warning)
        own = env.get("POD_NAMESPACE") or "default"
        return cls(
            namespaces=list(values["TASKHERD_WATCH_NAMESPACES"] or ()) or [own],
            lease_namespace=own,
            lease_name=values["TASKHERD_LEASE_NAME"],
            leader_election=values["TASKHERD_LEADER_ELECTION"],
            metrics_port=values["TASKHERD_OPERATOR_METRICS_PORT"],
            liveness_endpoint=health_endpoint(values["TASKHERD_OPERATOR_HEALTH_PORT"]),
            default_alertmanager_url=values["TASKHERD_ALERTMANAGER_URL"],
            worker_metrics_port=values["TASKHERD_WORKER_METRICS_PORT"],
        )
