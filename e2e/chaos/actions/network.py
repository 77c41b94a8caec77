"""A network partition between worker pods and a service: iptables DROP rules in the pods' own
network namespaces (from their node), both directions, for every address the service answers on
(its ClusterIP and its pods). Established connections stall rather than reset — what a real
partition looks like — and the rules go when the fault heals (or with the pod, if it is replaced)."""
from __future__ import annotations

from typing import Any, Mapping

from ..nodes import ContainerProcess
from ..world import QUORUM_NAMESPACE, SERVICES_NAMESPACE, STORE_NAMESPACE
from . import Action, ActionError, Context, Injection, one_of, workers

COMMENT = "taskherd-chaos-partition"


def service_addresses(ctx: Context, namespace: str, service: str) -> list[str]:
    """The Service's ClusterIP and the IPs of the pods behind it."""
    svc = ctx.cluster.kubectl_json("-n", namespace, "get", "service", service)
    addresses = [ip for ip in svc["spec"].get("clusterIPs") or [svc["spec"].get("clusterIP")] if ip and ip != "None"]
    pods = ctx.cluster.kubectl_json("-n", namespace, "get", "pods", "-l", f"app.kubernetes.io/name={service}")
    addresses += [p["status"]["podIP"] for p in pods["items"] if (p.get("status") or {}).get("podIP")]
    if not addresses:
        raise ActionError(f"service {namespace}/{service} has no address to cut off")
    return sorted(set(addresses))


def _rules(address: str) -> list[list[str]]:
    tag = ["-m", "comment", "--comment", COMMENT, "-j", "DROP"]
    return [["OUTPUT", "-d", address, *tag], ["INPUT", "-s", address, *tag]]


class Partition(Action):
    name = "partition"
    targets = ("half-workers", "all-workers", "busiest-worker")
    params = {"from": one_of("broker", "store", "postgres")}

    def inject(self, ctx: Context, target: str, params: Mapping[str, Any]) -> Injection:
        peer = params.get("from", "broker")
        namespace, service = self._peer(ctx, peer)
        addresses = service_addresses(ctx, namespace, service)
        pods = workers(ctx, target)
        cut: list[tuple[str, ContainerProcess]] = []
        for pod in pods:
            process = ctx.nodes.main_process(ctx.namespace, pod)
            for address in addresses:
                for rule in _rules(address):
                    ctx.nodes.in_network_namespace(process, ["iptables", "-w", "-I", *rule])
            cut.append((pod, process))
        evidence = {"pods": pods, "peer": f"{namespace}/{service}", "addresses": addresses}

        def recover() -> None:
            for pod, process in cut:
                for address in addresses:
                    for rule in _rules(address):
                        # The pod may be gone (replaced): its namespace and its rules went with it.
                        ctx.nodes.in_network_namespace(process, ["iptables", "-w", "-D", *rule], check=False)

        return Injection(f"partitioned {', '.join(pods)} from {namespace}/{service} ({', '.join(addresses)})",
                         recover, evidence)

    @staticmethod
    def _peer(ctx: Context, peer: str) -> tuple[str, str]:
        tenancy = ctx.release.tenancy
        if peer == "store":
            return STORE_NAMESPACE, "redis"
        if peer == "postgres":
            return SERVICES_NAMESPACE, "postgres"
        if tenancy.broker == "redis":
            return SERVICES_NAMESPACE, "redis"
        return (QUORUM_NAMESPACE if tenancy.quorum else SERVICES_NAMESPACE), "rabbitmq"
