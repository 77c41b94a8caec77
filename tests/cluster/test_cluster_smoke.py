"""Smoke tests of the cluster itself: what a user of the chart and the operator relies on.

Each test runs in its own namespace (fixture `namespace` of e2e/lib/pytest_plugin.py). They run
against whichever cluster e2e/lib/cluster.py selects; an unreachable cluster fails them with the
exact error.
"""
from __future__ import annotations

import ipaddress
import json
import time
from pathlib import Path

import pytest

from e2e.lib import cluster as clusterlib

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

FIXTURES = Path(__file__).parent / "fixtures"


def pod_manifest(name: str, image: tuple[str, str], command: str, extra_container: str = "",
                 extra_spec: str = "", labels: str = "") -> str:
    img, policy = image
    return f"""
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  labels: {{app: {name}{labels}}}
spec:
  restartPolicy: Always
{extra_spec}
  containers:
  - name: main
    image: {img}
    imagePullPolicy: {policy}
    command: ["bash", "-c", {json.dumps(command)}]
{extra_container}
"""


def wait_pod_ready(cluster, ns: str, name: str, timeout: float = 120) -> None:
    def state():
        status = cluster.kubectl_json("-n", ns, "get", "pod", name)["status"]
        ready = {c["type"]: c["status"] for c in status.get("conditions", [])}.get("Ready")
        # the phase and container states say why a pod is not Ready, should the wait time out
        return ready, status.get("phase"), [cs.get("state") for cs in status.get("containerStatuses", [])]
    cluster.wait(f"pod {ns}/{name} Ready", state, timeout, 0.5, until=lambda s: s[0] == "True")


def test_node_ready_and_versions(cluster):
    nodes = cluster.kubectl_json("get", "nodes")["items"]
    assert nodes, "the cluster has no nodes"
    for node in nodes:
        conds = {c["type"]: c for c in node["status"]["conditions"]}
        assert conds["Ready"]["status"] == "True", f"node {node['metadata']['name']}: {conds['Ready']}"
    version = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    pinned = clusterlib.versions()["KUBERNETES_VERSION"]
    assert version["clientVersion"]["gitVersion"] == pinned
    if cluster.is_local:
        # what `kubectl version` tells a user is the truth: the pinned release on both sides
        assert version["serverVersion"]["gitVersion"] == pinned
        assert version["serverVersion"]["major"] == "1"
        assert version["serverVersion"]["minor"] == pinned.split(".")[1]
        node = nodes[0]
        assert node["status"]["nodeInfo"]["kubeletVersion"] == pinned
        assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
        # RBAC and Node authorization are on: a node may not read other namespaces' secrets
        r = cluster.kubectl("auth", "can-i", "list", "secrets", "--all-namespaces",
                            f"--as=system:node:{node['metadata']['name']}", "--as-group=system:nodes",
                            check=False)
        assert r.stdout.split()[:1] == ["no"], r.stdout + r.stderr


def test_deployment_pods_run(cluster, namespace, test_image):
    img, policy = test_image
    cluster.apply(f"""
apiVersion: apps/v1
kind: Deployment
metadata:
  name: sleeper
spec:
  replicas: 2
  selector:
    matchLabels: {{app: sleeper}}
  template:
    metadata:
      labels: {{app: sleeper}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: main
        image: {img}
        imagePullPolicy: {policy}
        command: ["bash", "-c", "echo started on $(hostname); exec sleep infinity"]
""", namespace)
    cluster.kubectl("-n", namespace, "rollout", "status", "deploy/sleeper", "--timeout=120s", timeout=130)
    pods = cluster.kubectl_json("-n", namespace, "get", "pods", "-l", "app=sleeper")["items"]
    running = [p for p in pods if p["status"]["phase"] == "Running"]
    assert len(running) == 2, [p["status"] for p in pods]
    ips = {p["status"]["podIP"] for p in running}
    assert len(ips) == 2, f"pods share an IP: {ips}"
    if cluster.is_local:
        assert all(ipaddress.ip_address(ip) in ipaddress.ip_network("172.28.0.0/16") for ip in ips), ips
    name = running[0]["metadata"]["name"]
    # exec and logs work (apiserver -> kubelet -> containerd streaming)
    out = cluster.kubectl("-n", namespace, "exec", name, "--", "cat", "/etc/os-release").stdout
    assert "bookworm" in out or not cluster.is_local, out
    logs = cluster.wait("a container log line", lambda: cluster.kubectl("-n", namespace, "logs", name).stdout, 30)
    assert f"started on {name}" in logs


def test_service_resolves_through_coredns(cluster, namespace, test_image):
    img, policy = test_image
    cluster.apply(f"""
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 1
  selector:
    matchLabels: {{app: web}}
  template:
    metadata:
      labels: {{app: web}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: web
        image: {img}
        imagePullPolicy: {policy}
        command: ["bash", "-c", "mkdir -p /srv && echo served-by-web > /srv/index.html && exec python3 -m http.server 8080 --directory /srv"]
        ports: [{{containerPort: 8080, name: http}}]
        readinessProbe:
          tcpSocket: {{port: 8080}}
          periodSeconds: 1
---
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  selector: {{app: web}}
  ports: [{{port: 80, targetPort: http}}]
""", namespace)
    cluster.apply(pod_manifest("client", test_image, "exec sleep infinity",
                               extra_spec="  terminationGracePeriodSeconds: 1"), namespace)
    cluster.kubectl("-n", namespace, "rollout", "status", "deploy/web", "--timeout=120s", timeout=130)
    wait_pod_ready(cluster, namespace, "client")
    cluster_ip = cluster.kubectl("-n", namespace, "get", "svc", "web", "-o", "jsonpath={.spec.clusterIP}").stdout
    dns_ip = cluster.kubectl("-n", "kube-system", "get", "svc", "kube-dns", "-o",
                             "jsonpath={.spec.clusterIP}", check=False).stdout

    # the pod's resolver is the cluster DNS Service, with the namespace's search path
    resolv = cluster.kubectl("-n", namespace, "exec", "client", "--", "cat", "/etc/resolv.conf").stdout
    if dns_ip:
        assert f"nameserver {dns_ip}" in resolv, resolv
    assert f"search {namespace}.svc." in resolv, resolv

    fqdn = f"web.{namespace}.svc.cluster.local"
    for name in (fqdn, "web"):  # the full name and the short name through the search path
        out = cluster.wait(f"{name} to resolve in a pod",
                           lambda: cluster.kubectl("-n", namespace, "exec", "client", "--", "getent", "hosts", name,
                                                   check=False).stdout, 60)
        assert out.split()[0] == cluster_ip, f"{name} resolved to {out!r}, Service IP is {cluster_ip}"
    # and the Service carries traffic (kube-proxy) to the pod behind it
    fetch = ("import urllib.request; print(urllib.request.urlopen('http://web/index.html', timeout=5)"
             ".read().decode())")
    body = cluster.wait("HTTP through the Service",
                        lambda: cluster.kubectl("-n", namespace, "exec", "client", "--", "python3", "-c", fetch,
                                                check=False).stdout, 60)
    assert body.strip() == "served-by-web"
    # a name that does not exist gets NXDOMAIN-like failure, quickly (no upstream is consulted)
    t0 = time.monotonic()
    r = cluster.kubectl("-n", namespace, "exec", "client", "--", "getent", "hosts",
                        f"nope.{namespace}.svc.cluster.local", check=False)
    assert r.returncode != 0 and not r.stdout.strip()
    assert time.monotonic() - t0 < 10


def test_failing_exec_liveness_probe_restarts_container(cluster, namespace, test_image):
    # healthy for 4 s, then the probe's file disappears; the container must be restarted
    command = "touch /tmp/healthy; echo boot $(date +%s); sleep 4; rm -f /tmp/healthy; exec sleep infinity"
    probe = """    livenessProbe:
      exec: {command: ["cat", "/tmp/healthy"]}
      initialDelaySeconds: 1
      periodSeconds: 1
      failureThreshold: 2
      timeoutSeconds: 1
  terminationGracePeriodSeconds: 1"""
    cluster.apply(pod_manifest("probed", test_image, command, extra_container=probe), namespace)
    wait_pod_ready(cluster, namespace, "probed")

    cs = cluster.wait("a liveness restart (restartCount >= 1)", lambda: cluster.kubectl_json(
        "-n", namespace, "get", "pod", "probed")["status"]["containerStatuses"][0], 90,
        until=lambda status: status["restartCount"] >= 1)
    assert cs["lastState"]["terminated"]["exitCode"] in (137, 143), cs["lastState"]
    events = cluster.kubectl_json("-n", namespace, "get", "events", "--field-selector",
                                  "involvedObject.name=probed")["items"]
    messages = " | ".join(f"{e['reason']}: {e['message']}" for e in events)
    assert "Liveness probe failed" in messages, messages
    assert "failed liveness probe, will be restarted" in messages, messages
    # the previous container's log proves it was really started twice
    prev = cluster.kubectl("-n", namespace, "logs", "probed", "--previous").stdout
    assert prev.startswith("boot "), prev


def test_prestop_runs_before_sigterm_and_grace_period_is_honoured(cluster, namespace, test_image):
    """Measured from inside the pod: timestamps appended to a hostPath file by the preStop hook,
    by the container's SIGTERM trap, and by a ticker that runs until SIGKILL."""
    grace, prestop_sleep = 8, 3
    host_dir = f"/tmp/taskherd-smoke/{namespace}"
    node = cluster.kubectl_json("get", "nodes")["items"][0]["metadata"]["name"]
    volume = f"""  nodeName: {node}
  terminationGracePeriodSeconds: {grace}
  volumes:
  - name: out
    hostPath: {{path: {host_dir}, type: DirectoryOrCreate}}"""
    # ignores SIGTERM after recording it, like a worker still draining: only SIGKILL ends it
    command = ("now() { date +%s.%N; }; "
               "trap 'echo sigterm $(now) >> /out/events' TERM; "
               "echo start $(now) >> /out/events; "
               "while true; do echo tick $(now) >> /out/events; sleep 0.1; done")
    container = f"""    volumeMounts: [{{name: out, mountPath: /out}}]
    lifecycle:
      preStop:
        exec:
          command: ["bash", "-c", "echo prestop-start $(date +%s.%N) >> /out/events; sleep {prestop_sleep}; echo prestop-end $(date +%s.%N) >> /out/events"]"""
    cluster.apply(pod_manifest("draining", test_image, command, extra_container=container, extra_spec=volume),
                  namespace)
    wait_pod_ready(cluster, namespace, "draining")

    def ticks() -> str:
        return cluster.kubectl("-n", namespace, "exec", "draining", "--", "grep", "-c", "^tick", "/out/events",
                               check=False).stdout.strip()
    cluster.wait("ticks recorded by the container", ticks, 30, 0.2, until=lambda count: count not in ("", "0"))
    t0 = time.monotonic()
    cluster.kubectl("-n", namespace, "delete", "pod", "draining", "--wait=true", "--timeout=60s", timeout=70)
    deletion_took = time.monotonic() - t0

    # read the record back through another pod on the same node
    cluster.apply(pod_manifest("reader", test_image, "exec sleep infinity", extra_container="""    volumeMounts: [{name: out, mountPath: /out}]""",
                               extra_spec=volume.replace(f"terminationGracePeriodSeconds: {grace}",
                                                         "terminationGracePeriodSeconds: 1")), namespace)
    wait_pod_ready(cluster, namespace, "reader")
    text = cluster.kubectl("-n", namespace, "exec", "reader", "--", "cat", "/out/events").stdout
    cluster.kubectl("-n", namespace, "exec", "reader", "--", "rm", "-f", "/out/events", check=False)
    events: dict[str, list[float]] = {}
    for line in text.splitlines():
        kind, _, ts = line.partition(" ")
        events.setdefault(kind, []).append(float(ts))
    for kind in ("start", "prestop-start", "prestop-end", "sigterm", "tick"):
        assert kind in events, f"no {kind!r} recorded; events file:\n{text[-2000:]}"
    prestop_start, prestop_end = events["prestop-start"][0], events["prestop-end"][0]
    sigterm, last_tick = events["sigterm"][0], max(events["tick"])
    assert len(events["sigterm"]) == 1
    # preStop ran to completion before SIGTERM was sent
    assert prestop_start < prestop_end <= sigterm, (prestop_start, prestop_end, sigterm)
    assert prestop_end - prestop_start >= prestop_sleep - 0.2
    # the process kept running after SIGTERM until the grace period (counted from the start of
    # preStop) ran out, and was then killed: no tick long after the grace period
    lived = last_tick - prestop_start
    print(f"preStop {prestop_end - prestop_start:.2f}s, SIGTERM {sigterm - prestop_start:.2f}s and last sign of "
          f"life {lived:.2f}s after preStop began (grace {grace}s); kubectl delete took {deletion_took:.1f}s")
    assert grace - 2.5 <= lived <= grace + 4.0, f"killed {lived:.2f}s after preStop began; grace {grace}s"
    assert last_tick - sigterm >= grace - prestop_sleep - 2.5, (sigterm, last_tick)
    assert grace - 1.0 <= deletion_took <= grace + 15, f"kubectl delete took {deletion_took:.1f}s"


def test_helm_install_minimal_chart(cluster, namespace, test_image):
    img, policy = test_image
    chart = FIXTURES / "minichart"
    # values are validated against the chart's schema: a wrong type is refused with the key named
    bad = cluster.helm("install", "bad", str(chart), "-n", namespace, "--set", "replicas=many", check=False)
    assert bad.returncode != 0 and "replicas" in bad.stderr, bad.stderr

    cluster.helm("install", "smoke", str(chart), "-n", namespace, "--wait", "--timeout", "180s",
                 "--set", f"image={img}", "--set", f"pullPolicy={policy}", "--set", "message=installed-by-helm",
                 timeout=200)
    status = json.loads(cluster.helm("status", "smoke", "-n", namespace, "-o", "json").stdout)
    assert status["info"]["status"] == "deployed"
    dep = cluster.kubectl_json("-n", namespace, "get", "deploy", "smoke-web")
    assert dep["status"].get("availableReplicas") == 1, dep["status"]
    # the release's Service serves the ConfigMap content from the release's pod
    cluster.apply(pod_manifest("client", test_image, "exec sleep infinity",
                               extra_spec="  terminationGracePeriodSeconds: 1"), namespace)
    wait_pod_ready(cluster, namespace, "client")
    fetch = ("import urllib.request; print(urllib.request.urlopen('http://smoke-web/index.html', timeout=5)"
             ".read().decode())")
    body = cluster.wait("the release's Service", lambda: cluster.kubectl(
        "-n", namespace, "exec", "client", "--", "python3", "-c", fetch, check=False).stdout, 60)
    assert body.strip() == "installed-by-helm"

    cluster.helm("uninstall", "smoke", "-n", namespace, "--wait", "--timeout", "120s", timeout=130)
    left = cluster.kubectl("-n", namespace, "get", "deploy,svc,cm", "-l", "app.kubernetes.io/instance=smoke",
                           "-o", "name").stdout
    assert left.strip() == "", left
