"""The chart on a real cluster: install with a sample Celery app and Celery beat, `helm test`, liveness
during a long task and on a wedged worker, `helm upgrade` under load with no task lost and never two
beats at once, `helm uninstall` leaving only the CRD, a bad values file leaving nothing.

One release for the whole module (installing takes a while); the tests run in file order and each
states what it leaves for the next. The namespace (e2e/lib/pytest_plugin.py's, for the module)
enforces the `restricted` Pod Security Standard, so a pod the chart renders outside it would be
refused by the API server; a failing test's report carries its pods, events and logs.

The broker is the loopback Redis of `scripts/services.sh` (a leased database), reached from the
pods through a small TCP forwarder this module runs on the pods' gateway address: the local
cluster's pods cannot reach the host's loopback. Local cluster only (`make cluster`, `make images`).
"""
from __future__ import annotations

import logging
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import redis
import yaml

from chart_support import CHART, CI_VALUES, excluded_from_dry_run, render
from e2e.lib import cluster as clusterlib
from e2e.lib import services
from e2e.lib.containers import container_main_pid
from e2e.lib.forwarder import Forwarder, pod_gateway_address
from e2e.lib.pytest_plugin import create_test_namespace
from e2e.lib.waiting import wait_for

# Installing (images, operator scaling) and the rollout under load take minutes, not seconds.
pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(900)]
log = logging.getLogger("taskherd.e2e.chart")

APP = Path(__file__).parent / "apps" / "chart_app.py"
QUEUE = "chart"
POOL = "work"
SOFT, HARD, DRAIN_MARGIN, SHUTDOWN = 100, 120, 10, 5


class Release:
    def __init__(self, k8s: clusterlib.Cluster, namespace: str, name: str, values_file: Path,
                 host_broker_url: str) -> None:
        self.k8s, self.namespace, self.name, self.values_file = k8s, namespace, name, values_file
        self.host_broker_url = host_broker_url
        self.ledger = redis.Redis.from_url(host_broker_url)
        self.deployment = f"{name}-taskherd-{POOL}"

    def kubectl(self, *args: str, **kw) -> subprocess.CompletedProcess:
        return self.k8s.kubectl("-n", self.namespace, *args, **kw)

    def get(self, *args: str) -> dict:
        return self.k8s.kubectl_json("-n", self.namespace, "get", *args)

    def worker_pods(self) -> list[dict]:
        pods = self.get("pods", "-l", f"taskherd.io/pool={POOL},app.kubernetes.io/instance={self.name}")["items"]
        return [p for p in pods if not p["metadata"].get("deletionTimestamp")]

    def ready_workers(self) -> list[dict]:
        return [p for p in self.worker_pods()
                if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))]

    def send(self, key: str, seconds: float) -> None:
        from celery import Celery

        producer = Celery(broker=self.host_broker_url)
        try:
            producer.send_task("chart.work", args=(key, seconds), queue=QUEUE)
        finally:
            producer.close()

    def done(self) -> set[str]:
        return {k.decode() for k in self.ledger.smembers("done")}


def restart_count(pod: dict) -> int:
    return sum(c.get("restartCount", 0) for c in pod["status"].get("containerStatuses", []))


def image_values(reference: str) -> dict[str, str]:
    """registry, repository and tag of an image reference such as taskherd.local/worker:dev."""
    name, tag = reference.rsplit(":", 1)
    registry, repository = name.split("/", 1)
    return {"registry": registry, "repository": repository, "tag": tag}


@pytest.fixture(scope="module")
def release(cluster, request, tmp_path_factory):
    if cluster.source not in ("local", "kind"):
        pytest.fail("the chart's cluster tests run on the local cluster or kind: their pods reach this host's "
                    "loopback Redis through a forwarder on the host's address (the taskherd0 bridge, kind's "
                    "docker network), which another cluster does not have", pytrace=False)
    versions = clusterlib.versions()
    # TASKHERD_WORKER_IMAGE: test another build of the worker image than the pinned one.
    worker_image = os.environ.get("TASKHERD_WORKER_IMAGE") or versions["WORKER_IMAGE"]
    try:
        cluster.require_images([worker_image, versions["OPERATOR_IMAGE"]])
    except clusterlib.ImagesMissing as e:
        pytest.fail(str(e), pytrace=False)
    host_redis = os.environ.get("TASKHERD_REDIS_URL")
    if not host_redis:
        pytest.fail("TASKHERD_REDIS_URL is not set: run through `make test` (source scripts/services.sh env)")

    name = "th" + uuid.uuid4().hex[:5]
    with services.leased_redis_db(host_redis) as host_url:
        db = host_url.rsplit("/", 1)[1]
        gateway = pod_gateway_address(cluster)
        redis_port = int(host_url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
        forwarder = Forwarder(listen_host=gateway, target=("127.0.0.1", redis_port))
        pod_url = f"redis://{gateway}:{forwarder.port}/{db}"
        try:
            namespace = create_test_namespace(cluster, request,
                                              labels={"pod-security.kubernetes.io/enforce": "restricted"})
            cluster.kubectl("-n", namespace, "create", "secret", "generic", "broker", f"--from-literal=url={pod_url}")
            cluster.kubectl("-n", namespace, "create", "configmap", "chart-app", f"--from-file=chart_app.py={APP}")
            values = {
                "broker": {"existingSecret": {"name": "broker"}, "ports": [forwarder.port]},
                "workerPoolDefaults": {"image": {**image_values(worker_image), "pullPolicy": "Never"}},
                "operator": {"image": {**image_values(versions["OPERATOR_IMAGE"]), "pullPolicy": "Never"}},
                "exporter": {"image": {**image_values(worker_image), "pullPolicy": "Never"}, "intervalSeconds": 5},
                # Beat runs chart_app's schedule: chart.tick, naming its pod.
                "beat": {"enabled": True, "maxIntervalSeconds": 5,
                         "resources": {"requests": {"cpu": "10m", "memory": "96Mi"}, "limits": {"memory": "256Mi"}}},
                "workerPools": [{
                    "name": POOL, "app": "chart_app", "queues": [QUEUE], "concurrency": 2,
                    "timeLimits": {"softSeconds": SOFT, "hardSeconds": HARD},
                    "drainMarginSeconds": DRAIN_MARGIN, "shutdownSeconds": SHUTDOWN,
                    "resources": {"requests": {"cpu": "10m", "memory": "96Mi"}, "limits": {"memory": "384Mi"}},
                    "probes": {"liveness": {"periodSeconds": 5, "failureThreshold": 3}},
                    # The operator owns the replica count: min = max = 2 makes it scale 1 -> 2.
                    "autoscaling": {"minReplicas": 2, "maxReplicas": 2, "pollIntervalSeconds": 2,
                                    "scaleDownStabilizationSeconds": 0},
                    "env": [{"name": "PYTHONPATH", "value": "/app"},
                            # beat's chart.tick every 2 s: enough ticks to order two beats, little load
                            {"name": "TEST_BEAT_SECONDS", "value": "2"},
                            {"name": "TEST_LEDGER_URL",
                             "valueFrom": {"secretKeyRef": {"name": "broker", "key": "url"}}}],
                    "extraVolumes": [{"name": "app", "configMap": {"name": "chart-app"}}],
                    "extraVolumeMounts": [{"name": "app", "mountPath": "/app", "readOnly": True}],
                }],
            }
            values_file = tmp_path_factory.mktemp("values") / "values.yaml"
            values_file.write_text(yaml.safe_dump(values))
            rel = Release(cluster, namespace, name, values_file, host_url)
            result = cluster.helm("install", name, str(CHART), "-n", namespace, "-f", str(values_file),
                                  "--wait", "--timeout", "6m", check=False, timeout=420)
            if result.returncode != 0:
                pytest.fail(f"helm install failed: {result.stderr}", pytrace=False)
            yield rel
            cluster.helm("uninstall", name, "-n", namespace, "--wait", check=False, timeout=300)
        finally:
            forwarder.close()


def test_install_brings_up_restricted_ready_workers_scaled_by_the_operator(release):
    # helm --wait returned: every Deployment is available. The operator then scales to minReplicas.
    release.k8s.wait("ready workers (the operator scales the pool to 2)", lambda: len(release.ready_workers()),
                     180, 2, equals=2)
    deployment = release.get("deployment", release.deployment)
    assert deployment["spec"]["replicas"] == 2  # set by the operator through the scale subresource
    pod = release.ready_workers()[0]
    assert pod["spec"]["terminationGracePeriodSeconds"] == HARD + DRAIN_MARGIN + SHUTDOWN
    pool = release.get("workerpool", release.deployment)
    assert pool["spec"]["scaleTargetRef"]["name"] == release.deployment
    # A task round trip through the real broker.
    release.send("hello", 0.1)
    wait_for("task hello done", lambda: "hello" in release.done(), timeout=60, interval=1)


def test_beat_runs_one_replica_and_its_ticks_reach_the_workers(release):
    beat = release.get("deployment", f"{release.name}-taskherd-beat")
    assert beat["spec"]["replicas"] == 1 and beat["spec"]["strategy"]["type"] == "Recreate"
    wait_for("ticks of beat run by the workers", lambda: sum(
        release.ledger.zcard(f"ticks:{pod.decode()}") for pod in release.ledger.smembers("beats")),
        until=lambda ticks: ticks >= 3, timeout=120, interval=1)
    assert len(release.ledger.smembers("beats")) == 1


def test_helm_test_sends_a_ping_through_the_broker_to_a_worker(release):
    result = release.k8s.helm("test", release.name, "-n", release.namespace, "--timeout", "4m",
                              check=False, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Phase:          Succeeded" in output, output
    # The test pod's log, printed by helm: the answer names the worker that ran the ping.
    assert f"pong from celery@{release.deployment}-" in output, output


def test_liveness_passes_while_a_long_task_runs(release):
    before = {p["metadata"]["name"]: restart_count(p) for p in release.worker_pods()}
    release.send("long", 60)
    wait_for("task long started", lambda: release.ledger.get("runs:long"), timeout=30, interval=1)
    wait_for("task long done", lambda: "long" in release.done(), timeout=120, interval=2)
    after = {p["metadata"]["name"]: restart_count(p) for p in release.worker_pods()}
    assert after == before, "a worker was restarted while running a task within its limits"
    events = release.get("events", "--field-selector", "reason=Unhealthy")["items"]
    liveness_failures = [e["message"] for e in events if "Liveness" in e.get("message", "")]
    assert liveness_failures == []
    assert int(release.ledger.get("runs:long")) == 1


def test_a_wedged_worker_fails_liveness_and_is_restarted(release):
    pod = release.ready_workers()[0]
    name, restarts = pod["metadata"]["name"], restart_count(pod)
    container = next(c for c in pod["status"]["containerStatuses"] if c["name"] == "taskherd-worker")
    pid = container_main_pid(container["containerID"].split("://", 1)[1])
    os.kill(pid, 19)  # SIGSTOP: the main loop (and its heartbeat) stops; the pool children live on
    started = time.monotonic()

    try:
        release.k8s.wait(f"a liveness restart of {name} (restarts; were {restarts})",
                         lambda: restart_count(release.get("pod", name)), 180, 2, until=lambda n: n > restarts)
    finally:
        try:
            os.kill(pid, 18)  # SIGCONT, in case it was not killed
        except ProcessLookupError:
            pass
    took = time.monotonic() - started
    events = release.get("events", "--field-selector", f"involvedObject.name={name},reason=Unhealthy")["items"]
    assert any("Liveness probe failed" in e.get("message", "") for e in events), events
    log.info("wedged worker restarted after %.0f s", took)
    # Stale after 6 heartbeat intervals (30 s) + 3 failed probes 5 s apart + the liveness grace
    # period (15 s; a SIGSTOPped process ignores SIGTERM): about a minute, far below the pod's
    # 135 s drain grace period it would otherwise wait.
    assert took < 120
    release.k8s.wait("ready workers again", lambda: len(release.ready_workers()), 180, 2, equals=2)


def test_helm_upgrade_under_load_loses_no_task(release):
    # 40 tasks x 4 s on 2 workers x 2 processes: ~40 s of work, longer than new workers take to
    # become ready, so old workers are drained while tasks run and queued ones wait.
    keys = [f"load-{i}" for i in range(40)]
    for key in keys:
        release.send(key, 4)
    wait_for("load started", lambda: release.ledger.get(f"runs:{keys[0]}"), timeout=60, interval=0.5)
    old_pods = {p["metadata"]["name"] for p in release.worker_pods()}
    # Any change of the pod template rolls every worker (each old one drains in preStop first) and
    # the beat (Recreate: the old one exits before the new one starts).
    # --set-string: a hex id that happens to be all digits would otherwise reach the chart as a
    # number, which its validation rightly refuses for an annotation (about 1 run in 17 failed on it).
    rollout = uuid.uuid4().hex[:6]
    release.k8s.helm("upgrade", release.name, str(CHART), "-n", release.namespace, "-f", str(release.values_file),
                     "--set-string", f"workerPools[0].podAnnotations.rollout={rollout}",
                     "--set-string", f"beat.podAnnotations.rollout={rollout}",
                     "--wait", "--timeout", "6m", timeout=420)
    wait_for("load tasks done", lambda: len(set(keys) & release.done()), timeout=300, interval=2, equals=len(keys))
    new_pods = {p["metadata"]["name"] for p in release.worker_pods()}
    assert not (old_pods & new_pods), "the upgrade did not replace the workers"
    runs = {k: int(release.ledger.get(f"runs:{k}") or 0) for k in keys}
    effects = {k: release.ledger.get(f"effect:{k}") for k in keys}
    assert all(effects.values()), "a task's effect is missing"
    assert int(release.ledger.get("effects")) == len(keys) + 2  # + "hello" and "long" before
    by_old = sum(1 for pod in effects.values() if pod.decode() in old_pods)
    by_new = sum(1 for pod in effects.values() if pod.decode() in new_pods)
    # The load really spanned the rollout: the old workers and the new ones both did part of it.
    assert by_old and by_new, (by_old, by_new)
    log.info("upgrade under load: %d tasks, %d runs (redeliveries: %d), %d done by old workers, %d by new",
             len(keys), sum(runs.values()), sum(runs.values()) - len(keys), by_old, by_new)
    # The operator kept its replica count through the upgrade (no spec.replicas in the chart).
    assert release.get("deployment", release.deployment)["spec"]["replicas"] == 2


def test_two_beats_never_ran_at_once_across_the_upgrade(release):
    """Each beat pod's ticks (publish times) form an interval; across the upgrade's Recreate they
    follow one another and never overlap: no periodic task was sent twice."""
    def intervals():
        out = []
        for pod in release.ledger.smembers("beats"):
            ticks = release.ledger.zrange(f"ticks:{pod.decode()}", 0, -1, withscores=True)
            if ticks:
                out.append((ticks[0][1], ticks[-1][1], len(ticks), pod.decode()))
        return sorted(out)

    def beats_and_ticks_of_the_last():
        spans = intervals()
        return len(spans), (spans[-1][2] if spans else 0)

    wait_for("the new beat ticking (beat pods, ticks of the last)", beats_and_ticks_of_the_last,
             until=lambda seen: seen[0] >= 2 and seen[1] >= 3, timeout=180, interval=2)
    spans = intervals()
    log.info("beat pods and their ticks: %s", [(pod, n, round(end - start, 1)) for start, end, n, pod in spans])
    assert len(spans) == 2, spans
    (old_start, old_end, _, old_pod), (new_start, new_end, _, new_pod) = spans
    assert old_pod != new_pod
    assert old_end < new_start, f"beat {new_pod} sent at {new_start} before {old_pod} stopped at {old_end}"
    log.info("beats across the upgrade: %s's last tick %.1f s before %s's first", old_pod, new_start - old_end, new_pod)


def test_uninstall_leaves_only_the_crd(release):
    release.k8s.helm("uninstall", release.name, "-n", release.namespace, "--wait", "--timeout", "5m", timeout=330)
    kinds = ("deployments,replicasets,pods,services,configmaps,serviceaccounts,roles,rolebindings,"
             "poddisruptionbudgets,networkpolicies,leases,workerpools,secrets")

    def leftovers():
        items = release.get(kinds, "-l", f"app.kubernetes.io/instance={release.name}")["items"]
        return [f"{i['kind']}/{i['metadata']['name']}" for i in items]

    release.k8s.wait("nothing of the release left", leftovers, 180, 2, equals=[])
    # Nothing the operator created on its own either (its Lease was the chart's).
    assert release.get("leases")["items"] == []
    assert release.get("workerpools")["items"] == []
    crd = release.k8s.kubectl_json("get", "crd", "workerpools.taskherd.io")
    assert crd["metadata"]["name"] == "workerpools.taskherd.io"


BAD_INSTALLS = ["unquoted tag 1.10 in a pool", "pool named like the operator", "extraArgs overriding the hard limit",
                "memory request above the limit", "time limits set to null in the defaults",
                "PrometheusRule and an operator page for the same dead letters"]


@pytest.mark.parametrize("case", BAD_INSTALLS)
def test_a_bad_values_install_leaves_nothing_behind(release, case, tmp_path):
    """`helm install` refuses before it creates anything: no object, no release record. (The CRD in
    crds/ is installed by Helm before it validates values; it is cluster-wide and already here.)"""
    corpus = {c["name"]: c for c in yaml.safe_load((Path(__file__).parent / "corpus" / "bad-values.yaml").read_text())}
    values = tmp_path / "bad.yaml"
    values.write_text(corpus[case]["values"])
    name = "bad" + uuid.uuid4().hex[:5]
    crds_before = {c["metadata"]["name"] for c in release.k8s.kubectl_json("get", "crds")["items"]}
    result = release.k8s.helm("install", name, str(CHART), "-n", release.namespace,
                              "-f", str(Path(__file__).parent / "corpus" / "base-values.yaml"), "-f", str(values),
                              "--wait", "--timeout", "2m", check=False, timeout=180)
    assert result.returncode != 0
    assert corpus[case]["key"].split("[")[0].split(".")[0] in result.stderr, result.stderr
    everything = release.get("all,configmaps,secrets,serviceaccounts,roles,rolebindings,poddisruptionbudgets,"
                             "networkpolicies,leases,workerpools")["items"]
    left = [f"{i['kind']}/{i['metadata']['name']}" for i in everything
            if name in i["metadata"]["name"] or i["metadata"].get("labels", {}).get("app.kubernetes.io/instance") == name]
    assert left == []
    assert release.k8s.helm("status", name, "-n", release.namespace, check=False).returncode != 0
    assert {c["metadata"]["name"] for c in release.k8s.kubectl_json("get", "crds")["items"]} == crds_before


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.stem)
def test_every_scenario_is_accepted_by_the_api_server_under_restricted_pss(release, values):
    """Server-side dry run of each ci/ scenario in the test namespace (which enforces `restricted`):
    the real API server's schemas, the CRD's CEL rules and Pod Security admission all agree."""
    docs = [d for d in render([values], release=release.name, namespace=release.namespace)
            if not excluded_from_dry_run(d)]
    result = release.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump_all(docs), check=False)
    assert result.returncode == 0, result.stderr
    assert "PodSecurity" not in result.stderr, result.stderr
    assert len(result.stdout.strip().splitlines()) == len(docs)
