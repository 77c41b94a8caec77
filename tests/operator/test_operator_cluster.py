"""The operator against the REAL API server of the local cluster (`make cluster`), with a real
Redis queue on the host and the real Alertmanager on loopback.

Stand-in workers: pods of the cluster's base image serving `taskherd_tasks_in_flight` on the worker metrics port
(the worker's metrics contract) from a file, so a test marks a pod busy or idle with `kubectl exec`.
"""
from __future__ import annotations

import json
import os
import time
import urllib.parse
import urllib.request

import pytest
import redis

from e2e.lib.cluster import CommandFailed, wait_for
from taskherd.contract import WORKER_METRICS_PORT

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

FAKE_WORKER = r"""
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        try:
            n = open('/tmp/in_flight').read().strip() or '0'
        except OSError:
            n = '0'
        body = ('# TYPE taskherd_tasks_in_flight gauge\ntaskherd_tasks_in_flight %s\n' % n).encode()
        self.send_response(200)
        self.send_header('Content-Type', 'text/plain; version=0.0.4')
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(('', METRICS_PORT), H).serve_forever()
""".replace("METRICS_PORT", str(WORKER_METRICS_PORT))


def deployment(name: str, image: str, pull: str, replicas: int = 0) -> str:
    return json.dumps({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}}, "spec": {
                     "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "worker", "image": image, "imagePullPolicy": pull,
                                     "command": ["python3", "-c", FAKE_WORKER],
                                     "ports": [{"containerPort": WORKER_METRICS_PORT, "name": "metrics"}],
                                     "readinessProbe": {"tcpSocket": {"port": WORKER_METRICS_PORT},
                                                        "periodSeconds": 1}}]}}}})


def broker_secret(url: str) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "broker"},
                       "stringData": {"url": url}})


def workerpool(name: str, queue: str, **spec) -> str:
    body = {"scaleTargetRef": {"name": "workers"},
            "broker": {"type": "redis", "secretRef": {"name": "broker"}, "queues": [queue]},
            "minReplicas": 0, "maxReplicas": 4, "targetDepthPerWorker": 5, "pollIntervalSeconds": 2,
            "scaleDownStabilizationSeconds": 10}
    body.update(spec)
    return json.dumps({"apiVersion": "taskherd.io/v1alpha1", "kind": "WorkerPool", "metadata": {"name": name},
                       "spec": body})


def push(url: str, queue: str, count: int) -> None:
    client = redis.Redis.from_url(url)
    now = time.time()
    client.lpush(queue, *[json.dumps({"body": "", "headers": {"taskherd_published_at": now, "id": str(i)},
                                      "properties": {"delivery_tag": str(i)}}) for i in range(count)])


def replicas(cluster, ns: str) -> int:
    return int(cluster.kubectl("-n", ns, "get", "deploy", "workers", "-o", "jsonpath={.spec.replicas}").stdout)


def pool_status(cluster, ns: str, name: str = "pool") -> dict:
    return cluster.kubectl_json("-n", ns, "get", "workerpool", name).get("status") or {}


def pod_names(cluster, ns: str) -> set[str]:
    pods = cluster.kubectl_json("-n", ns, "get", "pods", "-l", "app=workers")["items"]
    return {p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp")}


def running_pods(cluster, ns: str) -> set[str]:
    pods = cluster.kubectl_json("-n", ns, "get", "pods", "-l", "app=workers")["items"]
    return {p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp")
            and any(c.get("type") == "Ready" and c.get("status") == "True" for c in p["status"].get("conditions", []))}


def set_in_flight(cluster, ns: str, pod: str, n: int) -> None:
    cluster.kubectl("-n", ns, "exec", pod, "--", "sh", "-c", f"echo {n} > /tmp/in_flight")


def test_backlog_scales_up_within_two_polls_and_idle_workers_go_first(
        cluster, namespace, pod_image, redis_url, unique_name, operator_factory):
    image, pull = pod_image
    ns, queue = namespace, unique_name
    cluster.apply(deployment("workers", image, pull), ns)
    cluster.apply(broker_secret(redis_url), ns)
    cluster.apply(workerpool("pool", queue), ns)
    op = operator_factory(ns)
    wait_for("the first poll", lambda: pool_status(cluster, ns).get("phase"), timeout=60, interval=0.5)
    assert replicas(cluster, ns) == 0

    push(redis_url, queue, 18)  # 18 messages at 5 per worker: 4 workers
    spike = time.monotonic()
    wait_for("scale-up to 4", lambda: replicas(cluster, ns) == 4, timeout=30, interval=0.2)
    reaction = time.monotonic() - spike
    print(f"\nbacklog -> Deployment scaled (seen by kubectl): {reaction:.2f} s at 2 s polls")
    assert reaction <= 2 * 2 + 1.0, f"scale-up took {reaction:.1f}s, more than two 2 s polls"
    status = pool_status(cluster, ns)
    assert status["lastScaleReason"].startswith("0 -> 4: depth 18")

    wait_for("4 ready workers", lambda: len(running_pods(cluster, ns)) == 4, timeout=120, interval=1)
    pods = sorted(running_pods(cluster, ns))
    busy = set(pods[:2])
    for pod in busy:
        set_in_flight(cluster, ns, pod, 1)
    redis.Redis.from_url(redis_url).delete(queue)
    emptied = time.monotonic()
    wait_for("scale-down to the 2 busy workers", lambda: replicas(cluster, ns) == 2, timeout=60, interval=0.5)
    print(f"queue emptied -> scaled down to the busy workers: {time.monotonic() - emptied:.1f} s (window 10 s)")
    assert time.monotonic() - emptied >= 10 - 2, "scale-down must wait for the stabilisation window"
    wait_for("idle pods gone", lambda: pod_names(cluster, ns) == busy, timeout=60, interval=0.5)
    annotations = {p["metadata"]["name"]: p["metadata"].get("annotations", {})
                   for p in cluster.kubectl_json("-n", ns, "get", "pods", "-l", "app=workers")["items"]}
    assert {annotations[p]["controller.kubernetes.io/pod-deletion-cost"] for p in busy} == {"1"}

    status = pool_status(cluster, ns)
    assert status["busyWorkers"] == 2 and status["desiredReplicas"] == 2
    for pod in busy:
        set_in_flight(cluster, ns, pod, 0)
    wait_for("scale to zero once idle", lambda: replicas(cluster, ns) == 0, timeout=60, interval=0.5)
    assert op.proc.poll() is None, op.log()[-3000:]

    # printer columns
    table = cluster.kubectl("-n", ns, "get", "wp", "pool").stdout
    assert table.split("\n")[0].split()[:7] == ["NAME", "DEPTH", "OLDEST", "DLQ", "REPLICAS", "DESIRED", "STATUS"]


def _alerts(base: str, pool: str) -> list[dict]:
    query = urllib.parse.quote(f'pool="{pool}"')
    with urllib.request.urlopen(f"{base}/api/v2/alerts?filter={query}", timeout=5) as response:
        return json.load(response)


def test_dead_letters_page_alertmanager_once_and_resolve(cluster, namespace, pod_image, redis_url, unique_name,
                                                         operator_factory):
    base = os.environ.get("TASKHERD_ALERTMANAGER_URL")
    if not base:
        pytest.fail("TASKHERD_ALERTMANAGER_URL is not set: run through `make test`")
    image, pull = pod_image
    ns, queue, pool = namespace, unique_name, f"pool-{unique_name[-8:]}"
    cluster.apply(deployment("workers", image, pull), ns)
    cluster.apply(broker_secret(redis_url), ns)
    cluster.apply(workerpool(pool, queue, deadLetter={"threshold": 3, "alertmanagerUrl": base,
                                                      "severity": "critical"}), ns)
    operator_factory(ns)
    wait_for("the first poll", lambda: pool_status(cluster, ns, pool).get("phase"), timeout=60, interval=0.5)

    push(redis_url, f"{queue}.dlq", 4)
    alerts = wait_for("the page in Alertmanager", lambda: _alerts(base, pool), timeout=30, interval=0.5)
    assert alerts[0]["labels"] == {"alertname": "TaskherdDeadLetterQueue", "pool": pool, "namespace": ns,
                                   "queue": f"{queue}.dlq", "severity": "critical"}
    status = pool_status(cluster, ns, pool)
    cond = next(c for c in status["conditions"] if c["type"] == "DeadLetterAlert")
    assert cond["status"] == "True" and status["phase"] == "DeadLetterAlert" and status["deadLetterDepth"] == 4
    time.sleep(6)  # three more polls: still one Warning Event
    events = cluster.kubectl_json("-n", ns, "get", "events", "--field-selector", "reason=DeadLetterThreshold")
    assert len(events["items"]) == 1 and events["items"][0]["type"] == "Warning"
    assert events["items"][0]["involvedObject"]["kind"] == "WorkerPool"

    redis.Redis.from_url(redis_url).delete(f"{queue}.dlq")
    wait_for("the resolution in Alertmanager", lambda: _alerts(base, pool) == [], timeout=30, interval=0.5)
    wait_for("DeadLetterAlert=False", lambda: any(
        c["type"] == "DeadLetterAlert" and c["status"] == "False"
        for c in pool_status(cluster, ns, pool).get("conditions", [])), timeout=20, interval=0.5)


def test_an_unreachable_broker_is_a_condition_and_the_operator_stays_up(cluster, namespace, pod_image, unique_name,
                                                                        operator_factory):
    image, pull = pod_image
    ns = namespace
    cluster.apply(deployment("workers", image, pull, replicas=1), ns)
    cluster.apply(broker_secret("redis://:secret-pw@127.0.0.1:1/5"), ns)
    cluster.apply(workerpool("pool", unique_name, minReplicas=1), ns)
    op = operator_factory(ns)
    status = wait_for("BrokerUnreachable", lambda: (s := pool_status(cluster, ns)).get("phase") == "BrokerUnreachable"
                      and s, timeout=60, interval=0.5)
    cond = next(c for c in status["conditions"] if c["type"] == "BrokerReachable")
    assert cond["status"] == "False" and "secret-pw" not in cond["message"] and cond["message"]
    time.sleep(5)
    assert op.proc.poll() is None and replicas(cluster, ns) == 1
    health = urllib.request.urlopen(f"http://127.0.0.1:{op.liveness_port}/healthz", timeout=5)
    assert health.status == 200


def test_two_replicas_elect_one_leader_and_hand_over(cluster, namespace, pod_image, redis_url, unique_name,
                                                     operator_factory):
    image, pull = pod_image
    ns, queue = namespace, unique_name
    cluster.apply(deployment("workers", image, pull), ns)
    cluster.apply(broker_secret(redis_url), ns)
    cluster.apply(workerpool("pool", queue), ns)
    first, second = operator_factory(ns), operator_factory(ns)
    lease = wait_for("a leader", lambda: cluster.kubectl_json("-n", ns, "get", "lease", "taskherd-operator"),
                     timeout=60, interval=0.5)
    holder = lease["spec"]["holderIdentity"]
    time.sleep(3)
    leaders = [op for op in (first, second) if "acquired lease" in op.log()]
    assert len(leaders) == 1, "exactly one replica leads"
    leaders[0].stop()  # SIGTERM releases the Lease
    other = second if leaders[0] is first else first
    wait_for("the other replica to take over", lambda: "acquired lease" in other.log(), timeout=30, interval=0.5)
    push(redis_url, queue, 6)
    wait_for("scale-up by the new leader", lambda: replicas(cluster, ns) == 2, timeout=20, interval=0.5)
    new = cluster.kubectl_json("-n", ns, "get", "lease", "taskherd-operator")["spec"]["holderIdentity"]
    assert new != holder


INVALID = [
    ({"minReplicas": 5, "maxReplicas": 2}, "spec.minReplicas must be less than or equal to spec.maxReplicas"),
    ({"maxReplicas": 0}, "spec.maxReplicas: Invalid value: 0: spec.maxReplicas in body should be greater than or equal to 1"),
    ({"targetDepthPerWorker": 0}, "spec.targetDepthPerWorker: Invalid value: 0: spec.targetDepthPerWorker in body should be greater than or equal to 1"),
    ({"pollIntervalSeconds": 900}, "spec.pollIntervalSeconds: Invalid value: 900: spec.pollIntervalSeconds in body should be less than or equal to 300"),
    ({"maxOldestMessageAgeSeconds": -3}, "spec.maxOldestMessageAgeSeconds: Invalid value: -3: spec.maxOldestMessageAgeSeconds in body should be greater than or equal to 1"),
    ({"broker": {"type": "kafka", "secretRef": {"name": "b"}, "queues": ["q"]}},
     "spec.broker.type kafka is not a known broker: must be redis or rabbitmq"),
    ({"broker": {"type": "redis", "secretRef": {"name": "b"}, "queues": []}}, "spec.broker.queues"),
    ({"scaleTargetRef": {"kind": "StatefulSet", "name": "w"}},
     "spec.scaleTargetRef.kind StatefulSet is not supported: must be Deployment"),
    ({"deadLetter": {"alertmanagerUrl": "ftp://am"}},
     "spec.deadLetter.alertmanagerUrl ftp://am is invalid: must start with http:// or https://"),
    ({"deadLetter": {"threshold": 0}}, "spec.deadLetter.threshold in body should be greater than or equal to 1"),
    ({"broker": {"type": "redis", "secretRef": {"name": "b", "managementUrlKey": "m"}, "queues": ["q"]}},
     "spec.broker.secretRef.managementUrlKey applies only to broker type rabbitmq"),
    ({"maxReplicas": None}, 'spec.maxReplicas: Required value'),
]


def test_invalid_workerpools_are_rejected_with_clear_messages(cluster, namespace):
    for change, message in INVALID:
        with pytest.raises(CommandFailed) as info:
            manifest = json.loads(workerpool("bad", "q", **change))
            manifest["spec"] = {k: v for k, v in manifest["spec"].items() if v is not None}
            cluster.apply(json.dumps(manifest), namespace)
        assert message in str(info.value), (change, str(info.value))
    cluster.apply(workerpool("good", "q"), namespace)
    spec = cluster.kubectl_json("-n", namespace, "get", "wp", "good")["spec"]
    assert spec["broker"]["secretRef"]["key"] == "url" and spec["minReplicas"] == 0  # defaults applied
    assert spec["pollIntervalSeconds"] == 2 and spec["scaleTargetRef"]["kind"] == "Deployment"
