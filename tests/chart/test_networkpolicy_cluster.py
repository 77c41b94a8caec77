"""The chart's NetworkPolicies, enforced by a real cluster: a worker reaches its broker and DNS and
nothing else; the operator reaches the API server, the broker (AMQP and the management API) and the
workers' metrics port; the metrics ports open only to the peers the values allow.

The NetworkPolicies are the ones `helm template` renders from the values below, applied as they are.
The pods they select are small probe pods carrying exactly the labels of the rendered worker and
operator pod templates, listening on the rendered ports: what is tested is the policies and the
cluster's enforcement of them, not Celery. Connections are real TCP connections between pods,
through Services and CoreDNS where a worker would use them.

Needs a cluster that enforces NetworkPolicy: the kind cluster (E2E_CLUSTER=kind: kube-router, or
kindnetd with a pulled node image). On one that does not (the local cluster's bridge network) the
test fails saying so; deselect it with `-m 'not networkpolicy'`.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field

import pytest
import yaml

from chart_support import REPO, render

sys.path.insert(0, str(REPO))
from e2e.lib import cluster as clusterlib  # noqa: E402
from e2e.lib.pytest_plugin import create_test_namespace  # noqa: E402

pytestmark = [pytest.mark.cluster, pytest.mark.networkpolicy, pytest.mark.timeout(900)]

AMQP, MANAGEMENT, OTHER_PORT = 5672, 15672, 8080
RELEASE = "np"
#: every probe pod accepts connections on the ports it is given
LISTENER = """
import socket, sys, threading
def serve(port):
    server = socket.create_server(("", port))
    while True:
        server.accept()[0].close()
for port in sys.argv[1:]:
    threading.Thread(target=serve, args=(int(port),)).start()
"""
CONNECT = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()"
VALUES = {
    "broker": {
        "type": "rabbitmq",
        "existingSecret": {"name": "broker"},
        "ports": [AMQP, MANAGEMENT],
        "networkPeers": [{"podSelector": {"matchLabels": {"app": "np-broker"}}}],
    },
    "networkPolicy": {
        "enabled": True,
        "metricsIngress": {"enabled": True, "from": [{"podSelector": {"matchLabels": {"role": "scraper"}}}]},
    },
}


@dataclass
class Probes:
    """Probe pods in one namespace, and TCP connections between them."""

    k8s: clusterlib.Cluster
    namespace: str
    image: tuple[str, str]
    worker_metrics: int = 0
    operator_metrics: int = 0
    policy_names: list[str] = field(default_factory=list)

    def pod(self, name: str, labels: dict[str, str], ports: list[int]) -> None:
        image, pull = self.image
        self.k8s.apply(json.dumps({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
            "spec": {"terminationGracePeriodSeconds": 0, "containers": [{
                "name": "probe", "image": image, "imagePullPolicy": pull,
                "command": ["python3", "-c", LISTENER, *map(str, ports)]}]},
        }), namespace=self.namespace)

    def service(self, name: str, selector: dict[str, str], ports: list[int]) -> None:
        self.k8s.apply(json.dumps({
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
            "spec": {"selector": selector, "ports": [{"name": f"p{p}", "port": p, "targetPort": p} for p in ports]},
        }), namespace=self.namespace)

    def ip(self, pod: str) -> str:
        return self.k8s.kubectl_json("-n", self.namespace, "get", "pod", pod)["status"]["podIP"]

    def connects(self, source: str, host: str, port: int) -> bool:
        r = self.k8s.kubectl("-n", self.namespace, "exec", source, "--", "python3", "-c", CONNECT, host,
                             str(port), check=False, timeout=30)
        return r.returncode == 0


def container_port(pod_template: dict, name: str) -> int:
    return next(p["containerPort"] for c in pod_template["spec"]["containers"]
                for p in c.get("ports", []) if p.get("name") == name)


@pytest.fixture(scope="module")
def probes(cluster, request):
    namespace = create_test_namespace(cluster, request)
    objects = render(values=VALUES, release=RELEASE, namespace=namespace)
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    templates = {o["metadata"]["labels"]["app.kubernetes.io/component"]: o["spec"]["template"]
                 for o in objects if o["kind"] == "Deployment"}
    p = Probes(cluster, namespace, cluster.test_image(),
               worker_metrics=container_port(templates["worker"], "metrics"),
               operator_metrics=container_port(templates["operator"], "metrics"),
               policy_names=sorted(o["metadata"]["name"] for o in policies))
    p.pod("broker", {"app": "np-broker"}, [AMQP, MANAGEMENT, OTHER_PORT])
    p.pod("other", {"app": "np-other"}, [AMQP, MANAGEMENT, OTHER_PORT])
    p.pod("worker", templates["worker"]["metadata"]["labels"], [p.worker_metrics, OTHER_PORT])
    p.pod("operator", templates["operator"]["metadata"]["labels"], [p.operator_metrics, OTHER_PORT])
    p.pod("scraper", {"role": "scraper"}, [OTHER_PORT])
    p.pod("stranger", {"app": "np-stranger"}, [OTHER_PORT])
    p.service("np-broker", {"app": "np-broker"}, [AMQP, MANAGEMENT, OTHER_PORT])
    p.service("np-other", {"app": "np-other"}, [AMQP, MANAGEMENT, OTHER_PORT])
    cluster.kubectl("-n", namespace, "wait", "--for=condition=Ready", "pod", "--all", "--timeout=180s", timeout=200)
    # Before the policies exist every pod reaches every other: a refusal later is theirs.
    for source, host in (("worker", "np-other"), ("stranger", p.ip("worker"))):
        clusterlib.wait_for(f"{source} -> {host}:{OTHER_PORT} before any policy",
                            lambda: p.connects(source, host, OTHER_PORT), timeout=60, interval=1)
    cluster.apply(yaml.safe_dump_all(policies), namespace=namespace)
    yield p


def test_chart_networkpolicies_are_enforced(probes):
    p = probes
    worker, operator, broker, other = (p.ip(n) for n in ("worker", "operator", "broker", "other"))
    api = "kubernetes.default.svc.cluster.local"
    #: (source, host, port, allowed, why)
    expectations = [
        ("worker", "np-broker", AMQP, True, "a worker reaches its broker, by Service name through CoreDNS"),
        ("worker", broker, OTHER_PORT, False, "on the broker pod, only the broker ports are open to a worker"),
        ("worker", "np-other", AMQP, False, "the broker port only at the broker's peers (networkPeers)"),
        ("worker", other, OTHER_PORT, False, "a worker reaches nothing else in the cluster"),
        ("worker", api, 443, False, "a worker does not reach the API server"),
        ("operator", api, 443, True, "the operator reaches the API server"),
        ("operator", "np-broker", MANAGEMENT, True, "the operator reaches the broker's management API"),
        ("operator", worker, p.worker_metrics, True, "the operator reads the workers' metrics port"),
        ("operator", other, OTHER_PORT, False, "the operator reaches nothing else"),
        ("scraper", worker, p.worker_metrics, True, "metricsIngress.from admits the scraper to a worker's metrics"),
        ("scraper", operator, p.operator_metrics, True, "... and to the operator's"),
        ("stranger", worker, p.worker_metrics, False, "the metrics port is closed to peers the values do not name"),
        ("stranger", operator, p.operator_metrics, False, "... the operator's too"),
        ("stranger", worker, OTHER_PORT, False, "a worker accepts nothing but metrics scrapes"),
        ("stranger", other, OTHER_PORT, True, "pods no policy selects still talk (the network works)"),
    ]
    denied = [e for e in expectations if not e[3]]
    # Enforcement follows the policies within seconds; a cluster that enforces none never blocks.
    try:
        clusterlib.wait_for("the first denied connection to be refused",
                            lambda: not p.connects(*denied[0][:3]), timeout=60, interval=1)
        enforcing = True
    except clusterlib.WaitTimeout:
        enforcing = False
    if not enforcing:
        leaks = [f"{s} -> {h}:{port} ({why})" for s, h, port, _, why in denied if p.connects(s, h, port)]
        if len(leaks) == len(denied):
            pytest.fail(f"this cluster does not enforce NetworkPolicy: with the chart's policies "
                        f"{p.policy_names} applied, every connection they deny still went through "
                        f"({len(leaks)} of {len(denied)}). Run on kind (E2E_CLUSTER=kind make test), or "
                        "deselect with -m 'not networkpolicy'.", pytrace=False)
    wrong = []
    for source, host, port, allowed, why in expectations:
        try:  # policies reach every node's rules within seconds
            clusterlib.wait_for(f"{source} -> {host}:{port} {'allowed' if allowed else 'denied'}",
                                lambda: p.connects(source, host, port) == allowed, timeout=20, interval=1)
        except clusterlib.WaitTimeout:
            wrong.append(f"{source} -> {host}:{port} {'was refused' if allowed else 'connected'}: expected "
                         f"{'allowed' if allowed else 'denied'} ({why})")
    assert not wrong, "NetworkPolicy enforcement differs from the chart's intent:\n" + "\n".join(wrong)
