"""Names, ports and settings of the in-cluster services: one definition, read by the manifests, the
deployer, the tunnels and the URLs."""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Mapping

NAMESPACE = "taskherd-services"
#: the Secret (in the services' namespace) holding every credential: keys below
SECRET = "taskherd-services"
SECRET_KEYS = ("username", "password", "redis-password", "erlang-cookie")
#: annotation on the namespace recording the settings it was deployed with
SETTINGS_ANNOTATION = "taskherd.io/services-settings"
FIELD_MANAGER = "taskherd-e2e-services"
PART_OF = "taskherd-services"
#: the uid and gid of the image's user (images/services/build.sh)
SERVICES_UID = 10002

COMPONENTS = ("redis", "rabbitmq", "postgres", "alertmanager", "prometheus")
#: in-cluster ports of each component's Service (and container), by name: each server's usual port
PORTS: Mapping[str, Mapping[str, int]] = {
    "redis": {"redis": 6379},
    "rabbitmq": {"amqp": 5672, "management": 15672},
    "postgres": {"postgres": 5432},
    "alertmanager": {"http": 9093},
    "prometheus": {"http": 9090},
}
#: RabbitMQ node counts: one broker, or a cluster with a majority for quorum queues
RABBITMQ_NODE_COUNTS = (1, 3, 5)
#: the headless Service giving RabbitMQ nodes their stable names (<pod>.rabbitmq-nodes.<ns>.svc)
RABBITMQ_NODES_SERVICE = "rabbitmq-nodes"
#: the ConfigMap whose keys Prometheus loads as rule files (tests put the chart's rules there)
PROMETHEUS_RULES_CONFIGMAP = "prometheus-rules"
#: the volume size of each stateful component, when a StorageClass provides volumes
VOLUME_SIZE = "1Gi"

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class SettingsError(ValueError):
    """A setting is out of range; the message names it as the caller wrote it and what is valid."""


@dataclass(frozen=True)
class Settings:
    """What to deploy. Everything else (names, ports, probes) is fixed."""

    #: RabbitMQ nodes: 1, or 3/5 for a cluster (quorum queues need a majority of nodes up)
    rabbitmq_nodes: int = 1
    #: namespaces whose pods Prometheus discovers and scrapes (containers' ports named `metrics`);
    #: empty: every namespace
    prometheus_namespaces: tuple[str, ...] = ()
    #: which of COMPONENTS to run
    components: tuple[str, ...] = field(default=COMPONENTS)

    def __post_init__(self) -> None:
        problems = []
        if self.rabbitmq_nodes not in RABBITMQ_NODE_COUNTS:
            problems.append(f"rabbitmq_nodes={self.rabbitmq_nodes!r}: must be one of "
                            f"{', '.join(map(str, RABBITMQ_NODE_COUNTS))} (1 broker, or an odd-sized cluster)")
        bad = [n for n in self.prometheus_namespaces if not isinstance(n, str) or not _DNS_LABEL.match(n)]
        if bad:
            problems.append(f"prometheus_namespaces={list(self.prometheus_namespaces)!r}: {bad!r} are not "
                            f"namespace names (lower-case letters, digits and '-', at most 63 characters)")
        unknown = [c for c in self.components if c not in COMPONENTS]
        if unknown or not self.components:
            problems.append(f"components={list(self.components)!r}: each must be one of {', '.join(COMPONENTS)} "
                            f"(at least one)")
        if problems:
            raise SettingsError("; ".join(problems))

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Settings":
        data = json.loads(text)
        return cls(rabbitmq_nodes=data["rabbitmq_nodes"],
                   prometheus_namespaces=tuple(data["prometheus_namespaces"]),
                   components=tuple(data["components"]))


def merge_settings(deployed: Settings | None, requested: Mapping[str, Any]) -> Settings:
    """The settings to deploy: what is deployed (or the defaults), with what the caller asked for.

    A caller that asks for nothing keeps what runs: the demo does not turn the chaos suite's
    RabbitMQ cluster back into one node. `requested` values of None mean "not asked".
    """
    asked = {k: v for k, v in requested.items() if v is not None}
    unknown = sorted(set(asked) - {"rabbitmq_nodes", "prometheus_namespaces", "components"})
    if unknown:
        raise SettingsError(f"unknown settings {unknown}: valid are rabbitmq_nodes, prometheus_namespaces, components")
    for key in ("prometheus_namespaces", "components"):
        if key in asked:
            asked[key] = tuple(asked[key])
    return replace(deployed or Settings(), **asked)
