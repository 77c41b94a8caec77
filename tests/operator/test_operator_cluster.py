"""The operator against the REAL API server of the local cluster (`make cluster`), with a real
Redis queue on the host (RabbitMQ's for the early notice) and the real Alertmanager on loopback.

Stand-in workers: pods of the cluster's base image serving `taskherd_tasks_in_flight` on the worker metrics port
(the worker's metrics contract) from a file, so a test marks a pod busy or idle with `kubectl exec`;
with a RATE variable, also the counters of a worker finishing that many one-second tasks a second
since it started (its runtime histogram's count and sum) and its 2 slots.
"""
from __future__ import annotations

import json
import os
import time
import urllib.parse
import urllib.request

import pytest
import redis

from e2e.lib.waiting import wait_for
from taskherd.contract import WORKER_METRICS_PORT

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

FAKE_WORKER = r"""
import http.server, os, time
STARTED = time.time()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        try:
            n = open('/tmp/in_flight').read().strip() or '0'
        except OSError:
            n = '0'
        body = '# TYPE taskherd_tasks_in_flight gauge\ntaskherd_tasks_in_flight %s\n' % n
        if os.environ.get('RATE'):
            done = float(os.environ['RATE']) * (time.time() - STARTED)
            body += ('taskherd_task_runtime_seconds_count{task="t"} %f\n'
                     'taskherd_task_runtime_seconds_sum{task="t"} %f\ntaskherd_worker_slots 2\n' % (done, done))
        body = body.encode()
        self.send_response(200)
        self.send_header('Content-Type', 'text/plain; version=0.0.4')
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(('', METRICS_PORT), H).serve_forever()
""".replace("METRICS_PORT", str(WORKER_METRICS_PORT))


def deployment(name: str, image: str, pull: str, replicas: int = 0, kind: str = "Deployment",
               env: dict[str, str] | None = None) -> str:
    return json.dumps({
        "apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 **({"serviceName": name} if kind == "StatefulSet" else {}),
                 "template": {"metadata": {"labels": {"app": name}}, "spec": {
                     "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "worker", "image": image, "imagePullPolicy": pull,
                                     "command": ["python3", "-c", FAKE_WORKER],
                                     "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
                                     "ports": [{"containerPort": WORKER_METRICS_PORT, "name": "metrics"}],
                                     "readinessProbe": {"tcpSocket": {"port": WORKER_METRICS_PORT},
                                                        "periodSeconds": 1}}]}}}})


def broker_secret(url: str, management: str | None = None) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "broker"},
                       "stringData": {"url": url, **({"management": management} if management else {})}})


def workerpool(name: str, queue: str, **spec) -> str:
    body = {"scaleTargetRef": {"name": "workers"},
            "broker": {"type": "redis", "secretRef": {"name": "broker"}, "queues": [queue]},
            "minReplicas": 0, "maxReplicas": 4, "targetDepthPerWorker": 5, "pollIntervalSeconds": 2,
            "scaleDownStabilizationSeconds": 10}
    body.update(spec)
    return json.dumps({"apiVersion": "taskherd.io/v1alpha1", "kind": "WorkerPool", "metadata": {"name": name},
                       "spec": body})


def pool_on_redis(cluster, ns: str, test_image: tuple[str, str], redis_url: str, queue: str, *, name: str = "pool",
                  kind: str = "Deployment", **spec) -> None:
    """Stand-in workers (a Deployment or StatefulSet named workers), the broker Secret and a WorkerPool."""
    image, pull = test_image
    cluster.apply(deployment("workers", image, pull, kind=kind), ns)
    cluster.apply(broker_secret(redis_url), ns)
    cluster.apply(workerpool(name, queue, **spec), ns)


def push(url: str, queue: str, count: int) -> None:
    client = redis.Redis.from_url(url)
    now = time.time()
    client.lpush(queue, *[json.dumps({"body": "", "headers": {"taskherd_published_at": now, "id": str(i)},
                                      "properties": {"delivery_tag": str(i)}}) for i in range(count)])


def replicas(cluster, ns: str, kind: str = "deploy", name: str = "workers") -> int:
    return int(cluster.kubectl("-n", ns, "get", kind, name, "-o", "jsonpath={.spec.replicas}").stdout)


def pool_status(cluster, ns: str, name: str = "pool") -> dict:
    return cluster.kubectl_json("-n", ns, "get", "workerpool", name).get("status") or {}


def condition(status: dict, type_: str) -> dict:
    return next((c for c in status.get("conditions") or [] if c["type"] == type_), {})


def ready(status: dict) -> tuple[str | None, str | None]:
    """The Ready and Status columns of `kubectl get wp`."""
    return condition(status, "Ready").get("status"), condition(status, "Ready").get("reason")


def events(cluster, ns: str, reason: str) -> list[dict]:
    return cluster.kubectl_json("-n", ns, "get", "events", "--field-selector", f"reason={reason}")["items"]


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
        cluster, namespace, test_image, redis_url, unique_name, operator_factory):
    ns, queue = namespace, unique_name
    pool_on_redis(cluster, ns, test_image, redis_url, queue)
    op = operator_factory(ns)
    cluster.wait("the first poll", lambda: pool_status(cluster, ns).get("conditions"), timeout=60, interval=0.5)
    assert replicas(cluster, ns) == 0

    push(redis_url, queue, 18)  # 18 messages at 5 per worker: 4 workers
    spike = time.monotonic()
    cluster.wait("scale-up to 4", lambda: replicas(cluster, ns), timeout=30, interval=0.2, equals=4)
    reaction = time.monotonic() - spike
    print(f"\nbacklog -> Deployment scaled (seen by kubectl): {reaction:.2f} s at 2 s polls")
    assert reaction <= 2 * 2 + 1.0, f"scale-up took {reaction:.1f}s, more than two 2 s polls"
    status = pool_status(cluster, ns)
    assert status["lastScaleReason"].startswith("0 -> 4: depth 18")
    rescale = cluster.wait("the SuccessfulRescale Event", lambda: events(cluster, ns, "SuccessfulRescale"), timeout=20)
    assert rescale[0]["type"] == "Normal" and rescale[0]["involvedObject"]["kind"] == "WorkerPool"
    assert rescale[0]["message"].startswith("New size: 4; reason: depth 18")

    cluster.wait("4 ready workers", lambda: len(running_pods(cluster, ns)), timeout=120, interval=1, equals=4)
    pods = sorted(running_pods(cluster, ns))
    busy = set(pods[:2])
    for pod in busy:
        set_in_flight(cluster, ns, pod, 1)
    redis.Redis.from_url(redis_url).delete(queue)
    emptied = time.monotonic()
    cluster.wait("scale-down to the 2 busy workers", lambda: replicas(cluster, ns), timeout=60, interval=0.5, equals=2)
    print(f"queue emptied -> scaled down to the busy workers: {time.monotonic() - emptied:.1f} s (window 10 s)")
    assert time.monotonic() - emptied >= 10 - 2, "scale-down must wait for the stabilisation window"
    cluster.wait("idle pods gone", lambda: pod_names(cluster, ns), timeout=60, interval=0.5, equals=busy)
    annotations = {p["metadata"]["name"]: p["metadata"].get("annotations", {})
                   for p in cluster.kubectl_json("-n", ns, "get", "pods", "-l", "app=workers")["items"]}
    assert {annotations[p]["controller.kubernetes.io/pod-deletion-cost"] for p in busy} == {"1"}

    status = pool_status(cluster, ns)
    assert status["busyWorkers"] == 2 and status["desiredReplicas"] == 2
    for pod in busy:
        set_in_flight(cluster, ns, pod, 0)
    cluster.wait("scale to zero once idle", lambda: replicas(cluster, ns), timeout=60, interval=0.5, equals=0)
    assert op.proc.poll() is None, op.log()[-3000:]

    # What a KEDA user reads in `kubectl get wp`: bounds, replicas, queue figures, the Ready condition.
    table = cluster.wait("the pool to show Idle", lambda: (t := cluster.kubectl("-n", ns, "get", "wp", "pool").stdout)
                         and "Idle" in t and t, timeout=20, interval=0.5)
    header, row = table.splitlines()[:2]
    assert header.split() == ["NAME", "MIN", "MAX", "REPLICAS", "DESIRED", "DEPTH", "OLDEST", "DLQ", "READY",
                              "STATUS", "AGE"]
    assert row.split()[:3] == ["pool", "0", "4"] and row.split()[-3:-1] == ["True", "Idle"], row


@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_a_burst_between_two_polls_is_scaled_for_within_seconds_not_at_the_next_poll(
        cluster, namespace, test_image, unique_name, operator_factory, request, broker):
    """The early notice (early_notice.py): a pool polled once a minute still scales a burst within
    a couple of seconds, because its ready messages are counted every second — on RabbitMQ over
    AMQP, where the management API would show the burst up to 5 s late."""
    ns, queue = namespace, unique_name
    if broker == "redis":
        url = request.getfixturevalue("redis_url")
        pool_on_redis(cluster, ns, test_image, url, queue, pollIntervalSeconds=60)
    else:
        url, api = request.getfixturevalue("amqp_url"), request.getfixturevalue("rabbitmq_api_url")
        declare_reported(url, api, queue)
        image, pull = test_image
        cluster.apply(deployment("workers", image, pull), ns)
        cluster.apply(broker_secret(url, management=api), ns)
        cluster.apply(workerpool("pool", queue, pollIntervalSeconds=60, broker={
            "type": "rabbitmq", "secretRef": {"name": "broker", "managementUrlKey": "management"},
            "queues": [queue]}), ns)
    operator_factory(ns)
    cluster.wait("the first poll", lambda: pool_status(cluster, ns).get("conditions"), timeout=60, interval=0.5)
    first_poll = time.monotonic()
    assert replicas(cluster, ns) == 0

    (push if broker == "redis" else publish_amqp)(url, queue, 18)
    burst = time.monotonic()
    cluster.wait("scale-up to 4", lambda: replicas(cluster, ns), timeout=30, interval=0.2, equals=4)
    reaction = time.monotonic() - burst
    print(f"\n{broker}: burst -> Deployment scaled (seen by kubectl): {reaction:.2f} s at 60 s polls")
    assert reaction <= 5.0 and time.monotonic() - first_poll < 60, f"scale-up took {reaction:.1f}s"
    assert pool_status(cluster, ns)["lastScaleReason"].startswith("0 -> 4: depth 18")


def declare_reported(amqp_url: str, api_url: str, queue: str) -> None:
    """The queue declared, and reported by the management API (until then a poll holds the pool:
    the broker has not said what the queue holds)."""
    import httpx
    from kombu import Connection

    from taskherd.queues.rabbitmq import vhost_of
    with Connection(amqp_url) as connection:
        connection.channel().queue_declare(queue, durable=True, auto_delete=False)
    path = f"{api_url}/api/queues/{urllib.parse.quote(vhost_of(amqp_url), safe='')}/{queue}"
    wait_for(f"the management API to report {queue}", lambda: "messages_ready" in httpx.get(path).json(),
             timeout=30, interval=0.5, equals=True)


def publish_amqp(url: str, queue: str, count: int) -> None:
    from kombu import Connection
    with Connection(url) as connection:
        channel = connection.channel()
        for _ in range(count):
            channel.basic_publish_confirm(channel.prepare_message(b"{}", properties={"timestamp": int(time.time())}),
                                          routing_key=queue)


def test_a_backlogs_workers_go_once_it_is_drained_when_the_workers_counters_say_the_arrivals_need_fewer(
        cluster, namespace, test_image, redis_url, unique_name, operator_factory):
    """Little's law from the workers' /metrics, read by the operator over the pod network: four
    workers finishing 0.1 one-second tasks a second each keep one worker of two slots busy, so
    once the backlog is gone the pool drops to 1 without waiting out its 30 s window."""
    ns, queue = namespace, unique_name
    image, pull = test_image
    cluster.apply(deployment("workers", image, pull, env={"RATE": "0.1"}), ns)
    cluster.apply(broker_secret(redis_url), ns)
    cluster.apply(workerpool("pool", queue, scaleDownStabilizationSeconds=30), ns)
    op = operator_factory(ns)
    cluster.wait("the first poll", lambda: pool_status(cluster, ns).get("conditions"), timeout=60, interval=0.5)
    push(redis_url, queue, 18)
    cluster.wait("scale-up to 4", lambda: replicas(cluster, ns), timeout=30, interval=0.2, equals=4)
    cluster.wait("4 ready workers", lambda: len(running_pods(cluster, ns)), timeout=120, interval=1, equals=4)
    # The backlog stays while a steady pool is read every 30 s: two readings give the throughput,
    # then the recommendations made before it (held whole, as the HPA holds them) leave the window.
    time.sleep(30 + 30 + 30 + 10)
    assert replicas(cluster, ns) == 4
    redis.Redis.from_url(redis_url).delete(queue)
    emptied = time.monotonic()
    cluster.wait("scale-down to the 1 worker the arrivals need", lambda: replicas(cluster, ns), timeout=30,
                 interval=0.5, equals=1)
    took = time.monotonic() - emptied
    print(f"\nqueue emptied -> down to Little's law's 1 worker: {took:.1f} s (window 30 s)")
    assert took < 15, f"{took:.0f}s: the window held the backlog's workers"
    assert op.proc.poll() is None, op.log()[-3000:]


def _alerts(base: str, pool: str) -> list[dict]:
    query = urllib.parse.quote(f'pool="{pool}"')
    with urllib.request.urlopen(f"{base}/api/v2/alerts?filter={query}", timeout=5) as response:
        return json.load(response)


def test_dead_letters_page_alertmanager_once_and_resolve(cluster, namespace, test_image, redis_url, unique_name,
                                                         operator_factory):
    base = os.environ.get("TASKHERD_ALERTMANAGER_URL")
    if not base:
        pytest.fail("TASKHERD_ALERTMANAGER_URL is not set: run through `make test`")
    ns, queue, pool = namespace, unique_name, f"pool-{unique_name[-8:]}"
    pool_on_redis(cluster, ns, test_image, redis_url, queue, name=pool,
                  deadLetter={"threshold": 3, "alertmanagerUrl": base, "severity": "critical"})
    operator_factory(ns)
    cluster.wait("the first poll", lambda: pool_status(cluster, ns, pool).get("conditions"), timeout=60, interval=0.5)

    push(redis_url, f"{queue}.dlq", 4)
    alerts = wait_for("the page in Alertmanager", lambda: _alerts(base, pool), timeout=30, interval=0.5)
    assert alerts[0]["labels"] == {"alertname": "TaskherdDeadLetterQueue", "pool": pool, "namespace": ns,
                                   "queue": f"{queue}.dlq", "severity": "critical"}
    status = pool_status(cluster, ns, pool)
    cond = next(c for c in status["conditions"] if c["type"] == "DeadLetterAlert")
    assert cond["status"] == "True" and ready(status) == ("True", "DeadLetterAlert") and status["deadLetterDepth"] == 4
    time.sleep(6)  # three more polls: still one Warning Event
    events = cluster.kubectl_json("-n", ns, "get", "events", "--field-selector", "reason=DeadLetterThreshold")
    assert len(events["items"]) == 1 and events["items"][0]["type"] == "Warning"
    assert events["items"][0]["involvedObject"]["kind"] == "WorkerPool"

    redis.Redis.from_url(redis_url).delete(f"{queue}.dlq")
    wait_for("the resolution in Alertmanager", lambda: _alerts(base, pool), timeout=30, interval=0.5, equals=[])
    cluster.wait("DeadLetterAlert=False", lambda: any(
        c["type"] == "DeadLetterAlert" and c["status"] == "False"
        for c in pool_status(cluster, ns, pool).get("conditions", [])), timeout=20, interval=0.5)


UNACTIONABLE = {
    # what is wrong -> (condition, reason, what its message says)
    "deployment-missing": ("ScaleTargetFound", "ScaleTargetNotFound", "Deployment {ns}/missing not found"),
    "secret-missing": ("BrokerReachable", "SecretNotFound", "broker Secret {ns}/no-such-secret not found"),
    "broker-unreachable": ("BrokerReachable", "BrokerUnreachable", "Redis at redis://:***@127.0.0.1:1/5"),
    "secret-of-the-other-broker": ("BrokerReachable", "SecretValueInvalid",
                                   "Secret {ns}/other-broker: key 'url' holds a rabbitmq URL but spec.broker.type is 'redis'"),
}


@pytest.mark.parametrize("problem", sorted(UNACTIONABLE))
def test_a_pool_that_cannot_be_acted_on_is_a_condition_and_an_event_and_the_operator_keeps_going(
        cluster, namespace, test_image, redis_url, unique_name, operator_factory, problem):
    """A WorkerPool that passes the schema but points at nothing usable: the operator says so on
    that pool and keeps serving the healthy pool next to it."""
    ns = namespace
    pool_on_redis(cluster, ns, test_image, redis_url, unique_name, name="healthy")
    # the broken pool scales a Deployment of its own: two pools naming one target are a conflict
    # of their own (ScaleTargetConflict), and the older one alone would scale it
    cluster.apply(deployment("broken-workers", *test_image), ns)
    own = {"scaleTargetRef": {"name": "broken-workers"}}
    broken = {"deployment-missing": {"scaleTargetRef": {"name": "missing"}},
              "secret-missing": {**own, "broker": {"type": "redis", "secretRef": {"name": "no-such-secret"},
                                                   "queues": [unique_name]}},
              "broker-unreachable": {**own, "broker": {"type": "redis", "secretRef": {"name": "unreachable"},
                                                       "queues": [unique_name]}},
              "secret-of-the-other-broker": {**own, "broker": {"type": "redis", "secretRef": {"name": "other-broker"},
                                                               "queues": [unique_name]}}}[problem]
    secrets = {"broker-unreachable": ("unreachable", "redis://:secret-pw@127.0.0.1:1/5"),
               "secret-of-the-other-broker": ("other-broker", "amqp://shop:secret-pw@127.0.0.1:1/shop")}
    if problem in secrets:
        name, url = secrets[problem]
        cluster.apply(json.dumps({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
                                  "stringData": {"url": url}}), ns)
    cluster.apply(workerpool("broken", unique_name, **broken), ns)
    op = operator_factory(ns)
    type_, reason, says = UNACTIONABLE[problem]
    status = cluster.wait(f"{type_}={reason}", lambda: (s := pool_status(cluster, ns, "broken"))
                          and condition(s, type_).get("reason") == reason and s, timeout=60, interval=0.5)
    assert condition(status, type_)["status"] == "False" and says.format(ns=ns) in condition(status, type_)["message"]
    assert ready(status) == ("False", reason) and "secret-pw" not in json.dumps(status)
    warning = cluster.wait(f"the {reason} Event", lambda: events(cluster, ns, reason), timeout=20)
    assert warning[0]["type"] == "Warning" and warning[0]["involvedObject"]["name"] == "broken"
    assert "secret-pw" not in warning[0]["message"]

    push(redis_url, unique_name, 6)
    cluster.wait("the healthy pool to scale up", lambda: replicas(cluster, ns), timeout=30, interval=0.5, equals=2)
    time.sleep(4)  # two more polls of the broken pool: still one Event, operator alive
    assert len(events(cluster, ns, reason)) == 1
    assert op.proc.poll() is None, op.log()[-3000:]
    health = urllib.request.urlopen(f"http://127.0.0.1:{op.liveness_port}/healthz", timeout=5)
    assert health.status == 200


def test_the_pause_annotation_holds_the_target_as_keda_does(cluster, namespace, test_image, redis_url, unique_name,
                                                            operator_factory):
    ns, queue = namespace, unique_name
    pool_on_redis(cluster, ns, test_image, redis_url, queue)
    cluster.kubectl("-n", ns, "annotate", "wp", "pool", "taskherd.io/paused-replicas=1")
    operator_factory(ns)
    push(redis_url, queue, 18)  # would need 4 workers
    cluster.wait("the paused size", lambda: replicas(cluster, ns), timeout=30, interval=0.5, equals=1)
    status = cluster.wait("Status Paused", lambda: (s := pool_status(cluster, ns)) and ready(s) == ("True", "Paused")
                          and s, timeout=20, interval=0.5)
    assert condition(status, "ScalingActive")["reason"] == "Paused" and status["observedDepth"] == 18
    time.sleep(5)
    assert replicas(cluster, ns) == 1, "held at 1 while paused"
    cluster.kubectl("-n", ns, "annotate", "wp", "pool", "taskherd.io/paused-replicas-")
    cluster.wait("autoscaling to resume", lambda: replicas(cluster, ns), timeout=30, interval=0.5, equals=4)
    assert events(cluster, ns, "Resumed") and events(cluster, ns, "Paused")


def test_a_statefulset_is_scaled_through_its_scale_subresource(cluster, namespace, test_image, redis_url, unique_name,
                                                               operator_factory):
    ns, queue = namespace, unique_name
    pool_on_redis(cluster, ns, test_image, redis_url, queue, kind="StatefulSet",
                  scaleTargetRef={"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "workers"})
    operator_factory(ns)
    push(redis_url, queue, 7)
    cluster.wait("the StatefulSet scaled to 2", lambda: replicas(cluster, ns, "statefulset"), timeout=30,
                 interval=0.5, equals=2)
    assert condition(pool_status(cluster, ns), "ScaleTargetFound")["message"] == f"StatefulSet {ns}/workers"


CLAIMS_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "workerclaims.e2e.taskherd.io"},
    "spec": {"group": "e2e.taskherd.io", "scope": "Namespaced",
             "names": {"kind": "WorkerClaim", "plural": "workerclaims", "singular": "workerclaim"},
             "versions": [{"name": "v1beta1", "served": True, "storage": True,
                           "subresources": {"scale": {"specReplicasPath": ".spec.replicas",
                                                      "statusReplicasPath": ".status.replicas"}},
                           "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                               "spec": {"type": "object", "properties": {"replicas": {"type": "integer"}}},
                               "status": {"type": "object", "properties": {"replicas": {"type": "integer"}}}}}}}]}}


def test_a_custom_resource_with_a_scale_subresource_is_scaled(cluster, namespace, redis_url, unique_name,
                                                              operator_factory):
    """Any /scale target, as for KEDA: here a custom resource with no pods and no selector (no
    busyness to read, so a scale-down is the target's own controller's business)."""
    ns, queue = namespace, unique_name
    cluster.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(CLAIMS_CRD))
    cluster.kubectl("wait", "--for=condition=Established", "crd/workerclaims.e2e.taskherd.io", "--timeout=60s")
    cluster.apply(json.dumps({"apiVersion": "e2e.taskherd.io/v1beta1", "kind": "WorkerClaim",
                              "metadata": {"name": "claims"}, "spec": {"replicas": 0}}), ns)
    # What a user adds to the operator's Role for such a target (rbac.md).
    cluster.apply(json.dumps({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                              "metadata": {"name": "taskherd-operator-claims"},
                              "rules": [{"apiGroups": ["e2e.taskherd.io"], "resources": ["workerclaims/scale"],
                                         "verbs": ["get", "patch"]}]}), ns)
    cluster.apply(json.dumps({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                              "metadata": {"name": "taskherd-operator-claims"},
                              "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                          "name": "taskherd-operator-claims"},
                              "subjects": [{"kind": "ServiceAccount", "name": "taskherd-operator",
                                            "namespace": ns}]}), ns)
    cluster.apply(broker_secret(redis_url), ns)
    cluster.apply(workerpool("pool", queue, scaleTargetRef={"apiVersion": "e2e.taskherd.io/v1beta1",
                                                            "kind": "WorkerClaim", "name": "claims"},
                             scaleDownStabilizationSeconds=0), ns)
    operator_factory(ns)
    push(redis_url, queue, 12)
    cluster.wait("the WorkerClaim scaled to 3", lambda: replicas(cluster, ns, "workerclaim", "claims"),
                 timeout=30, interval=0.5, equals=3)
    redis.Redis.from_url(redis_url).delete(queue)
    cluster.wait("the WorkerClaim scaled to 0", lambda: replicas(cluster, ns, "workerclaim", "claims"),
                 timeout=30, interval=0.5, equals=0)
    assert ready(pool_status(cluster, ns))[0] == "True"


def test_a_dry_run_operator_logs_what_it_would_do_and_changes_nothing(cluster, namespace, test_image, redis_url,
                                                                      unique_name, operator_factory):
    ns, queue = namespace, unique_name
    pool_on_redis(cluster, ns, test_image, redis_url, queue)
    push(redis_url, queue, 18)
    op = operator_factory(ns, dry_run=True)
    wait_for("the would-be scale in the log", lambda: f"**DRY-RUN**: would scale Deployment {ns}/workers to 4 "
             "replicas" in op.log(), timeout=30, interval=0.5)
    assert "poll completed: pools=1 scaled=1" in op.log()
    assert replicas(cluster, ns) == 0 and pool_status(cluster, ns) == {}
    assert events(cluster, ns, "SuccessfulRescale") == []
    assert cluster.kubectl("-n", ns, "get", "lease", "taskherd-operator", check=False).returncode != 0


def test_two_replicas_elect_one_leader_and_hand_over(cluster, namespace, test_image, redis_url, unique_name,
                                                     operator_factory):
    ns, queue = namespace, unique_name
    pool_on_redis(cluster, ns, test_image, redis_url, queue)
    first, second = operator_factory(ns), operator_factory(ns)
    lease = cluster.wait("a leader", lambda: cluster.kubectl_json("-n", ns, "get", "lease", "taskherd-operator"),
                         timeout=60, interval=0.5)
    holder = lease["spec"]["holderIdentity"]
    time.sleep(3)
    leaders = [op for op in (first, second) if "acquired lease" in op.log()]
    assert len(leaders) == 1, "exactly one replica leads"
    leaders[0].stop()  # SIGTERM releases the Lease
    other = second if leaders[0] is first else first
    wait_for("the other replica to take over", lambda: "acquired lease" in other.log(), timeout=30, interval=0.5)
    push(redis_url, queue, 6)
    cluster.wait("scale-up by the new leader", lambda: replicas(cluster, ns), timeout=20, interval=0.5, equals=2)
    new = cluster.kubectl_json("-n", ns, "get", "lease", "taskherd-operator")["spec"]["holderIdentity"]
    assert new != holder
