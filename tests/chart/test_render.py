"""What `helm install` would create, for the defaults and for each ci/ scenario."""
from __future__ import annotations

import json
import shutil

import pytest
import yaml

from chart_support import BROKER, CHART, CI_VALUES, KUBE_VERSION, by_kind, helm, render, render_error

WORKER = "taskherd-worker"


def container(deployment: dict, name: str) -> dict:
    return next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name)


def env_of(c: dict) -> dict[str, object]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}


def test_helm_lint_passes_for_every_scenario():
    for values in CI_VALUES:
        result = helm("lint", str(CHART), "--strict", "-f", str(values), "--kube-version", KUBE_VERSION,
                      check=False)
        assert result.returncode == 0, f"{values.name}:\n{result.stdout}{result.stderr}"


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.stem)
def test_every_scenario_renders_restricted_pods(values):
    """Each pod the chart creates meets the restricted Pod Security Standard."""
    objects = render([values])
    deployments = by_kind(objects, "Deployment")
    assert deployments
    for name, d in deployments.items():
        pod = d["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", name
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, name
            assert sc["capabilities"]["drop"] == ["ALL"], name
            assert sc["readOnlyRootFilesystem"] is True, name
            assert "resources" in c and c["resources"]["limits"]["memory"], name
        # Every writable path is an emptyDir with a size limit.
        for v in pod["volumes"]:
            assert "hostPath" not in v, name


def test_defaults_give_one_autoscaled_pool_and_the_operator():
    objects = render(values=BROKER)
    deployments = by_kind(objects, "Deployment")
    assert set(deployments) == {"th-taskherd-default", "th-taskherd-operator", "th-taskherd-exporter"}
    worker = deployments["th-taskherd-default"]
    # The operator owns the replica count: an upgrade must not reset it.
    assert "replicas" not in worker["spec"]
    pools = by_kind(objects, "WorkerPool")
    assert set(pools) == {"th-taskherd-default"}
    spec = pools["th-taskherd-default"]["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "th-taskherd-default"}
    assert spec["broker"] == {"type": "redis", "secretRef": {"name": "celery-broker", "key": "url"},
                              "queues": ["celery"], "deadLetterQueues": ["celery.dlq"]}
    assert (spec["minReplicas"], spec["maxReplicas"]) == (1, 10)
    assert spec["deadLetter"] == {"threshold": 1, "severity": "warning", "resendIntervalSeconds": 60}
    # Rolling upgrades never lower capacity: new workers come up before old ones drain.
    assert worker["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert set(by_kind(objects, "PodDisruptionBudget")) == {"th-taskherd-default", "th-taskherd-operator"}


def test_worker_pod_drains_probes_the_heartbeat_and_reads_the_broker_from_the_secret():
    worker = by_kind(render(values=BROKER), "Deployment")["th-taskherd-default"]
    pod = worker["spec"]["template"]["spec"]
    c = container(worker, WORKER)
    assert c["lifecycle"]["preStop"]["exec"]["command"] == ["taskherd", "drain"]
    assert env_of(c)["TASKHERD_DRAIN_DEADLINE"] == "320"
    # The worker's own server answers the probes (no process per probe), on its metrics port.
    assert c["startupProbe"]["httpGet"] == {"path": "/startupz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "metrics"}
    assert {p["name"]: p["containerPort"] for p in c["ports"]}["metrics"] == 9891
    # A new pod is noticed within a second of its worker being ready.
    assert c["startupProbe"]["periodSeconds"] == 1 and c["readinessProbe"]["periodSeconds"] == 1
    # A wedged worker is restarted in seconds, not after the pod's (long) drain grace period.
    assert c["livenessProbe"]["terminationGracePeriodSeconds"] == 15
    env = env_of(c)
    assert env["TASKHERD_BROKER_URL"] == {"secretKeyRef": {"name": "celery-broker", "key": "url"}}
    assert not any("redis://" in str(v) or "amqp://" in str(v) for v in env.values())
    assert env["TASKHERD_HEARTBEAT_DIR"] == "/run/taskherd/heartbeat"
    assert env["TASKHERD_HEARTBEAT_INTERVAL"] == "5"
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    for path in ("/tmp", "/run/taskherd/heartbeat", env["TASKHERD_METRICS_DIR"]):
        assert "emptyDir" in volumes[mounts[path]], path
    assert {"name": "metrics", "containerPort": 9891, "protocol": "TCP"} in c["ports"]
    assert env["TASKHERD_METRICS_PORT"] == "9891"
    assert c["command"][:4] == ["taskherd", "worker", "--app=tasks", "--queues=celery"]
    # Workers never talk to the API server: no token in their pods.
    assert pod["automountServiceAccountToken"] is False


def test_grace_period_is_derived_from_the_same_limits_the_worker_gets():
    values = {**BROKER, "workerPools": [
        {"name": "short", "app": "a", "queues": ["short"], "timeLimits": {"softSeconds": 50, "hardSeconds": 60}},
        {"name": "long", "app": "a", "queues": ["long"], "timeLimits": {"softSeconds": 3000, "hardSeconds": 3300},
         "drainMarginSeconds": 40, "shutdownSeconds": 15},
    ]}
    values["broker"] = {**values["broker"], "visibilityTimeoutSeconds": 7200}
    deployments = by_kind(render(values=values), "Deployment")
    for name, hard, soft, margin, shutdown in (("short", 60, 50, 20, 10), ("long", 3300, 3000, 40, 15)):
        d = deployments[f"th-taskherd-{name}"]
        c = container(d, WORKER)
        env = env_of(c)
        grace = d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert grace == hard + margin + shutdown
        assert int(env["TASKHERD_TIME_LIMIT"]) == hard
        assert int(env["TASKHERD_SOFT_TIME_LIMIT"]) == soft
        assert int(env["TASKHERD_DRAIN_DEADLINE"]) == hard + margin
        # The drain deadline leaves the shutdown allowance before SIGKILL.
        assert grace - int(env["TASKHERD_DRAIN_DEADLINE"]) == shutdown
        assert c["lifecycle"]["preStop"]["exec"]["command"] == ["taskherd", "drain"]
        assert f"--time-limit={hard}" in c["command"] and f"--soft-time-limit={soft}" in c["command"]
        assert int(env["TASKHERD_VISIBILITY_TIMEOUT"]) == 7200 > hard


def test_an_explicit_grace_period_that_is_long_enough_is_kept():
    values = {**BROKER, "workerPools": [{"name": "p", "app": "a", "terminationGracePeriodSeconds": 900}]}
    d = by_kind(render(values=values), "Deployment")["th-taskherd-p"]
    assert d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 900


def test_page_severity_and_resend_interval_reach_the_workerpool():
    """A payments pool pages as critical and re-sends every 30 s; the other pool keeps the defaults."""
    values = {**BROKER, "workerPoolDefaults": {"autoscaling": {"deadLetter": {"resendIntervalSeconds": 120}}},
              "workerPools": [
                  {"name": "payments", "app": "a", "queues": ["payments"],
                   "autoscaling": {"deadLetter": {"severity": "critical", "resendIntervalSeconds": 30}}},
                  {"name": "reports", "app": "a", "queues": ["reports"]}]}
    pools = by_kind(render(values=values), "WorkerPool")
    assert pools["th-taskherd-payments"]["spec"]["deadLetter"] == {
        "threshold": 1, "severity": "critical", "resendIntervalSeconds": 30}
    assert pools["th-taskherd-reports"]["spec"]["deadLetter"] == {
        "threshold": 1, "severity": "warning", "resendIntervalSeconds": 120}


def test_a_pool_overrides_defaults_with_false_and_zero():
    """A pool can turn autoscaling off and set minReplicas 0 (sprig's merge would drop both)."""
    values = {**BROKER, "workerPools": [
        {"name": "fixed", "app": "a", "autoscaling": {"enabled": False}, "replicas": 3},
        {"name": "zero", "app": "a", "autoscaling": {"minReplicas": 0}},
    ]}
    objects = render(values=values)
    deployments = by_kind(objects, "Deployment")
    assert deployments["th-taskherd-fixed"]["spec"]["replicas"] == 3
    assert "replicas" not in deployments["th-taskherd-zero"]["spec"]
    pools = by_kind(objects, "WorkerPool")
    assert set(pools) == {"th-taskherd-zero"}
    assert pools["th-taskherd-zero"]["spec"]["minReplicas"] == 0
    # Keys the pool did not mention keep their defaults.
    assert pools["th-taskherd-zero"]["spec"]["maxReplicas"] == 10


def test_rabbitmq_multipool_scenario():
    objects = render([CHART / "ci" / "rabbitmq-multipool-values.yaml"])
    deployments = by_kind(objects, "Deployment")
    fast, reports = deployments["th-taskherd-fast"], deployments["th-taskherd-reports"]
    assert "replicas" not in fast["spec"] and reports["spec"]["replicas"] == 2
    assert reports["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 1900
    c = container(reports, WORKER)
    assert env_of(c)["REPORTS_BUCKET"] == "reports"
    assert "--max-tasks-per-child=1" in c["command"]
    assert {"name": "cache", "mountPath": "/var/cache/reports"} in c["volumeMounts"]
    assert container(fast, WORKER)["command"][3] == "--queues=orders,emails"
    pools = by_kind(objects, "WorkerPool")
    assert set(pools) == {"th-taskherd-fast"}
    spec = pools["th-taskherd-fast"]["spec"]
    assert spec["broker"]["type"] == "rabbitmq"
    assert spec["broker"]["secretRef"] == {"name": "rabbitmq-broker", "key": "amqp-url",
                                           "managementUrlKey": "management-url"}
    assert spec["broker"]["deadLetterQueues"] == ["orders.dlq", "emails.dlq"]
    assert spec["minReplicas"] == 0
    assert spec["deadLetter"] == {"threshold": 5, "severity": "warning", "resendIntervalSeconds": 60,
                                  "alertmanagerUrl": "http://alertmanager.monitoring:9093"}
    policies = by_kind(objects, "NetworkPolicy")
    worker_egress = policies["th-taskherd-worker"]["spec"]["egress"]
    broker_rule = next(r for r in worker_egress if {"port": 5672, "protocol": "TCP"} in r.get("ports", []))
    assert broker_rule["to"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "messaging"}}}]
    assert any(r.get("to") == [{"ipBlock": {"cidr": "10.20.0.0/16"}}] for r in worker_egress)
    api_rule = next(r for r in policies["th-taskherd-operator"]["spec"]["egress"]
                    if {"port": 6443, "protocol": "TCP"} in r.get("ports", []))
    assert api_rule["to"] == [{"ipBlock": {"cidr": "10.0.0.1/32"}}]


def test_network_policies_allow_only_dns_broker_api_server_and_the_operator_reading_workers():
    policies = by_kind(render(values=BROKER), "NetworkPolicy")
    worker = policies["th-taskherd-worker"]["spec"]
    assert worker["policyTypes"] == ["Ingress", "Egress"]
    # The only ingress: the operator reading busyness on the metrics port.
    assert worker["ingress"] == [{
        "from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "taskherd",
                                                   "app.kubernetes.io/instance": "th",
                                                   "app.kubernetes.io/component": "operator"}}}],
        "ports": [{"port": 9891, "protocol": "TCP"}]}]
    ports = [p for r in worker["egress"] for p in r["ports"]]
    assert sorted((p["port"], p["protocol"]) for p in ports) == [(53, "TCP"), (53, "UDP"), (6379, "TCP")]
    operator = policies["th-taskherd-operator"]["spec"]
    assert operator["ingress"] == []  # no metrics ingress unless asked for
    op_ports = sorted({p["port"] for r in operator["egress"] for p in r["ports"]})
    assert op_ports == [53, 443, 6379, 6443, 9891]


def test_operator_runs_two_replicas_with_a_leader_lease_and_a_namespaced_role_without_wildcards():
    objects = render(values=BROKER)
    op = by_kind(objects, "Deployment")["th-taskherd-operator"]
    assert op["spec"]["replicas"] == 2
    c = container(op, "taskherd-operator")
    assert c["command"] == ["python3", "-m", "taskherd.operator"]
    assert c["args"] == ["--namespace=$(POD_NAMESPACE)", "--liveness=http://0.0.0.0:9894/healthz",
                         "--metrics-port=9893"]
    env = env_of(c)
    assert env["TASKHERD_LEASE_NAME"] == "th-taskherd-operator"
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["TASKHERD_WORKER_METRICS_PORT"] == "9891"
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert not by_kind(objects, "ClusterRole") and not by_kind(objects, "ClusterRoleBinding")
    role = by_kind(objects, "Role")["th-taskherd-operator"]
    rules = {(g, r): rule for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    for rule in role["rules"]:
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], rule
    assert set(rules[("apps", "deployments")]["verbs"]) == {"get", "list", "watch"}
    assert set(rules[("apps", "deployments/scale")]["verbs"]) == {"get", "patch", "update"}
    assert rules[("", "secrets")]["resourceNames"] == ["celery-broker"]
    assert rules[("", "secrets")]["verbs"] == ["get"]
    assert ("", "pods/exec") not in rules
    lease_rules = [r for r in role["rules"] if r["resources"] == ["leases"]]
    assert [(r["resourceNames"], r["verbs"]) for r in lease_rules] == [(["th-taskherd-operator"], ["get", "update"])]
    # The chart creates the Lease itself, so the operator needs no `create` and uninstall removes it.
    assert by_kind(objects, "Lease")["th-taskherd-operator"]["spec"] == {}
    assert set(rules[("taskherd.io", "workerpools")]["verbs"]) == {"get", "list", "watch", "patch"}
    assert set(rules[("taskherd.io", "workerpools/status")]["verbs"]) == {"get", "patch"}
    assert set(rules[("", "pods")]["verbs"]) == {"get", "list", "watch", "patch"}
    binding = by_kind(objects, "RoleBinding")["th-taskherd-operator"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "th-taskherd-operator", "namespace": "jobs"}]


def test_minimal_scenario_has_no_operator_objects():
    objects = render([CHART / "ci" / "minimal-values.yaml"])
    # One Deployment, and the `helm test` pod (a hook: created only by `helm test`).
    assert sorted(o["kind"] for o in objects) == ["Deployment", "Pod"]
    (d,) = by_kind(objects, "Deployment").values()
    assert d["spec"]["replicas"] == 3
    (test,) = by_kind(objects, "Pod").values()
    assert test["metadata"]["annotations"]["helm.sh/hook"] == "test"


def test_monitoring_scenario_ships_the_rules_file_and_the_dashboard():
    objects = render([CHART / "ci" / "monitoring-values.yaml"])
    rule = by_kind(objects, "PrometheusRule")["th-taskherd"]
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    # The PrometheusRule is the tested rules file, unchanged, plus what the chart records from the values.
    tested = yaml.safe_load((CHART / "files" / "prometheus-rules.yaml").read_text())
    assert rule["spec"]["groups"][:-1] == tested["groups"]
    assert rule["spec"]["groups"][-1]["name"] == "taskherd-values"
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert alerts == {"TaskherdDeadLetterQueue", "TaskherdOldestMessageTooOld", "TaskherdTaskErrorRateHigh",
                      "TaskherdWorkerRestarting", "TaskherdPoolChildKilled", "TaskherdHeartbeatStale", "TaskherdExporterDown",
                      "TaskherdExporterFailing", "TaskherdOperatorErrors", "TaskherdOperatorNoLeader"}
    pm = by_kind(objects, "PodMonitor")["th-taskherd-worker"]
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    assert pm["spec"]["selector"]["matchExpressions"] == [
        {"key": "app.kubernetes.io/component", "operator": "In", "values": ["worker", "exporter"]}]
    # Every scraped series carries its pod's pool and release (the alerts group by both: two releases
    # in one namespace must not merge); the operator's too, beside the per-pool labels it honours.
    release = {"sourceLabels": ["__meta_kubernetes_pod_label_app_kubernetes_io_instance"], "targetLabel": "release"}
    assert pm["spec"]["podMetricsEndpoints"][0]["relabelings"] == [
        {"sourceLabels": ["__meta_kubernetes_pod_label_taskherd_io_pool"], "targetLabel": "pool"}, release]
    sm = by_kind(objects, "ServiceMonitor")["th-taskherd-operator"]
    assert sm["spec"]["endpoints"][0]["honorLabels"] is True
    assert sm["spec"]["endpoints"][0]["relabelings"] == [release]
    service = by_kind(objects, "Service")["th-taskherd-operator-metrics"]
    assert all(service["metadata"]["labels"][k] == v for k, v in sm["spec"]["selector"]["matchLabels"].items())
    dashboard = by_kind(objects, "ConfigMap")["th-taskherd-dashboard"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["taskherd.json"])["uid"] == "taskherd"
    ingress = by_kind(objects, "NetworkPolicy")["th-taskherd-worker"]["spec"]["ingress"]
    assert {"port": 9891, "protocol": "TCP"} in ingress[-1]["ports"]
    assert ingress[-1]["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]


def test_labels_and_selectors_follow_the_kubernetes_conventions():
    for o in render(values=BROKER):
        labels = o["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == "th", o["metadata"]["name"]
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["helm.sh/chart"].startswith("taskherd-")
        if o["kind"] == "Deployment":
            selector = o["spec"]["selector"]["matchLabels"]
            template = o["spec"]["template"]["metadata"]["labels"]
            assert all(template[k] == v for k, v in selector.items())
            # The chart version is not in the selector (selectors are immutable).
            assert "helm.sh/chart" not in selector and "app.kubernetes.io/version" not in selector


def test_notes_tell_the_user_how_to_see_pools_and_where_alerts_go(tmp_path):
    # `helm template` skips NOTES.txt and `helm install --dry-run` has no --kube-version (this
    # helm's built-in default, v1.20, fails the chart's kubeVersion); so a copy of the chart
    # renders the same NOTES.txt text into a ConfigMap.
    chart = tmp_path / "taskherd"
    shutil.copytree(CHART, chart)
    notes_text = (chart / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "NOTES.txt").unlink()
    (chart / "templates" / "_notes.tpl").write_text('{{- define "notes" }}' + notes_text + "{{- end }}")
    (chart / "templates" / "notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n"
        "data:\n  notes: {{ include \"notes\" . | quote }}\n")
    result = helm("template", "th", str(chart), "--namespace", "jobs", "--kube-version", KUBE_VERSION,
                  "--show-only", "templates/notes.yaml",
                  "--set", "broker.existingSecret.name=celery-broker",
                  "--set", "workerPools[0].name=default", "--set", "workerPools[0].app=tasks",
                  "--set", "workerPools[0].autoscaling.deadLetter.alertmanagerUrl=http://am:9093")
    notes = yaml.safe_load(result.stdout)["data"]["notes"]
    assert "kubectl get workerpools -n jobs" in notes
    assert "Alertmanager at http://am:9093" in notes
    assert "grace period 330s" in notes
    assert "Secret celery-broker" in notes


def _unknown_fields(value: object, schema: dict, path: str) -> list[str]:
    """Fields of a rendered object that the CRD's structural schema does not declare."""
    if isinstance(value, dict) and "properties" in schema:
        out = []
        for key, item in value.items():
            if key not in schema["properties"]:
                out.append(f"{path}.{key}")
            else:
                out += _unknown_fields(item, schema["properties"][key], f"{path}.{key}")
        return out
    if isinstance(value, list) and "items" in schema:
        return [e for i, item in enumerate(value) for e in _unknown_fields(item, schema["items"], f"{path}[{i}]")]
    return []


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.stem)
def test_rendered_workerpools_use_only_fields_the_crd_declares(values):
    """The CRD in crds/ is written by the operator's side: field names must agree, or the API
    server would prune what the chart sets."""
    crd = yaml.safe_load((CHART / "crds" / "workerpools.taskherd.io.yaml").read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1")
    schema = version["schema"]["openAPIV3Schema"]
    for name, pool in by_kind(render([values]), "WorkerPool").items():
        assert pool["apiVersion"] == f"{crd['spec']['group']}/v1alpha1"
        assert _unknown_fields(pool["spec"], schema["properties"]["spec"], "spec") == [], name
        assert set(schema["properties"]["spec"]["required"]) <= set(pool["spec"]), name


def _crd_refusals(value: object, schema: dict, path: str) -> list[str]:
    """What the CRD's OpenAPI schema says of a rendered spec: types, required fields, ranges, lengths,
    enums and sets (its CEL rules are the cluster's: tests/operator/test_workerpool_corpus.py)."""
    kinds = {"object": dict, "array": list, "string": str, "integer": int, "number": (int, float),
             "boolean": bool}
    if not isinstance(value, kinds[schema["type"]]) or (schema["type"] == "integer" and isinstance(value, bool)):
        return [f"{path}={value!r}: not of type {schema['type']}"]
    out = []
    if isinstance(value, dict):
        out += [f"{path}.{key}: required" for key in schema.get("required", []) if key not in value]
        for key, item in value.items():
            out += _crd_refusals(item, schema["properties"][key], f"{path}.{key}")
    if isinstance(value, list):
        if len(value) > schema.get("maxItems", len(value)) or len(value) < schema.get("minItems", 0):
            out.append(f"{path}: {len(value)} items")
        if schema.get("x-kubernetes-list-type") == "set" and len(set(value)) != len(value):
            out.append(f"{path}: duplicates")
        out += [e for i, item in enumerate(value) for e in _crd_refusals(item, schema["items"], f"{path}[{i}]")]
    if isinstance(value, str) and not schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", len(value)):
        out.append(f"{path}: {len(value)} characters")
    if isinstance(value, (int, float)) and not schema.get("minimum", value) <= value <= schema.get("maximum", value):
        out.append(f"{path}={value}: out of range")
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{path}={value!r}: not in the enum")
    return out


def _at_the_bounds(bound: str) -> dict:
    """A pool whose every autoscaling number is at the chart schema's `bound` (minimum or maximum),
    with the most and the longest queue names the schema allows."""
    schema = json.loads((CHART / "values.schema.json").read_text())["definitions"]["pool"]["properties"]

    def numbers(node: dict) -> dict:
        return {key: numbers(sub) if "properties" in sub else sub[bound]
                for key, sub in node["properties"].items() if "properties" in sub or sub.get("type") == "integer"}

    autoscaling = numbers(schema["autoscaling"])
    longest = schema["queues"]["items"]["maxLength"] - len(".dlq")  # the default dead-letter queue fits
    if bound == "maximum":
        queues = [f"{i:02d}" + "q" * (longest - 2) for i in range(schema["queues"]["maxItems"])]
        autoscaling["deadLetter"]["alertmanagerUrl"] = "http://[fd00::1]:65535/alertmanager%20eu"
    else:
        queues = ["q"]
        autoscaling["deadLetter"]["webhookUrl"] = "https://hooks.example:1/dlq?token=a%2Fb#x"
    return {**BROKER, "workerPools": [{"name": "p", "app": "tasks", "queues": queues, "autoscaling": autoscaling}]}


@pytest.mark.parametrize("values", [*CI_VALUES, "minimum", "maximum"],
                         ids=lambda v: v if isinstance(v, str) else v.stem)
def test_every_workerpool_the_chart_renders_passes_the_crd_and_the_operator(values):
    """Anything the chart renders must be stored by the API server and read by the operator: a bound
    looser in values.schema.json than in the CRD (targetDepthPerWorker 1000000 vs 100000) was an
    error from the API server at install, and one looser than parse_spec's a Ready=False pool later."""
    from taskherd.operator.policy import parse_spec

    crd = yaml.safe_load((CHART / "crds" / "workerpools.taskherd.io.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    objects = render([values]) if not isinstance(values, str) else render(values=_at_the_bounds(values))
    pools = by_kind(objects, "WorkerPool")
    assert pools or not isinstance(values, str)
    for name, pool in pools.items():
        assert _crd_refusals(pool["spec"], schema, "spec") == [], name
        parse_spec(pool["spec"])


def test_an_image_digest_pins_the_image():
    digest = "sha256:" + "a" * 64
    values = {**BROKER, "workerPoolDefaults": {"image": {"registry": "registry.example", "repository": "app",
                                                         "digest": digest}},
              "operator": {"image": {"digest": digest}}}
    deployments = by_kind(render(values=values), "Deployment")
    assert container(deployments["th-taskherd-default"], WORKER)["image"] == f"registry.example/app@{digest}"
    assert container(deployments["th-taskherd-operator"], "taskherd-operator")["image"] == f"taskherd.local/operator@{digest}"


def test_the_exporter_watches_every_pools_queues_with_the_broker_from_the_secret():
    objects = render([CHART / "ci" / "rabbitmq-multipool-values.yaml"])
    exporter = by_kind(objects, "Deployment")["th-taskherd-exporter"]
    c = container(exporter, "taskherd-exporter")
    assert c["command"] == ["taskherd", "exporter"]
    env = env_of(c)
    assert env["TASKHERD_QUEUES"] == "orders,emails,reports"
    assert env["TASKHERD_DEAD_LETTER_QUEUES"] == "orders.dlq,emails.dlq,reports.dlq"
    assert env["TASKHERD_BROKER_URL"] == {"secretKeyRef": {"name": "rabbitmq-broker", "key": "amqp-url"}}
    assert env["TASKHERD_MANAGEMENT_URL"] == {"secretKeyRef": {"name": "rabbitmq-broker", "key": "management-url"}}
    policy = by_kind(objects, "NetworkPolicy")["th-taskherd-exporter"]["spec"]
    assert policy["ingress"] == []
    assert sorted({p["port"] for r in policy["egress"] for p in r["ports"]}) == [53, 5672, 15672]


def test_valid_values_render_exactly_as_written(tmp_path):
    """Helm reads numbers as float64: a million must not become 1.048576e+06, a quoted tag "1.10" must
    not become 1.1, and an empty tag is the chart's appVersion (as in `helm create` charts)."""
    values = tmp_path / "values.yaml"
    values.write_text("""
broker: {existingSecret: {name: celery-broker}, visibilityTimeoutSeconds: 2592000}
workerPoolDefaults:
  image: {tag: "1.10"}
  resources: {requests: {cpu: 100m, memory: 2Gi}, limits: {memory: 4Gi}}
operator: {image: {tag: ""}}
workerPools:
  - name: p
    app: tasks
    maxMemoryPerChildKb: 1048576
    maxTasksPerChild: 1000000000
    timeLimits: {softSeconds: 500000, hardSeconds: 600000}
    heartbeatIntervalSeconds: 2.5
""")
    objects = render([values])
    worker = by_kind(objects, "Deployment")["th-taskherd-p"]
    c = container(worker, WORKER)
    assert c["image"] == "taskherd.local/worker:1.10"
    assert "--max-memory-per-child=1048576" in c["command"]
    assert "--max-tasks-per-child=1000000000" in c["command"]
    assert "--time-limit=600000" in c["command"] and "--soft-time-limit=500000" in c["command"]
    env = env_of(c)
    assert env["TASKHERD_MAX_MEMORY_PER_CHILD_KB"] == "1048576"
    assert env["TASKHERD_VISIBILITY_TIMEOUT"] == "2592000"
    assert env["TASKHERD_HEARTBEAT_INTERVAL"] == "2.5"
    assert env["TASKHERD_DRAIN_DEADLINE"] == "600020"
    assert worker["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 600030
    assert worker["metadata"]["annotations"]["taskherd.io/grace-period"] == (
        "600030s = hard 600000s + drain margin 20s + shutdown 10s")
    operator = by_kind(objects, "Deployment")["th-taskherd-operator"]
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert container(operator, "taskherd-operator")["image"] == f"taskherd.local/operator:{app_version}"


def test_visibility_timeout_is_not_checked_on_rabbitmq():
    # A broker whose consumer_timeout was raised (3 h), which the hard limit must stay below.
    values = {**BROKER, "workerPools": [{"name": "p", "app": "a",
                                         "timeLimits": {"softSeconds": 5000, "hardSeconds": 7200},
                                         "env": [{"name": "TASKHERD_RABBITMQ_CONSUMER_TIMEOUT", "value": "10800"}]}]}
    values["broker"] = {**values["broker"], "type": "rabbitmq"}
    objects = render(values=values)
    # The broker ports follow the broker type when not given: AMQP and the management API.
    egress = by_kind(objects, "NetworkPolicy")["th-taskherd-worker"]["spec"]["egress"]
    assert [p["port"] for r in egress for p in r["ports"] if p["port"] != 53] == [5672, 15672]


def test_a_global_registry_replaces_every_image_registry():
    values = {**BROKER, "global": {"imageRegistry": "mirror.example:5000"}}
    images = {c["image"] for d in by_kind(render(values=values), "Deployment").values()
              for c in d["spec"]["template"]["spec"]["containers"]}
    assert images == {"mirror.example:5000/worker:dev", "mirror.example:5000/operator:dev"}


def test_first_class_chart_habits_render_as_users_expect():
    """ci/features-values.yaml: registry mirror, common annotations, a pool ServiceAccount with a cloud
    identity, an init container and a sidecar, beat, the helm test pod, an extra object."""
    objects = render([CHART / "ci" / "features-values.yaml"])
    # extraDeploy objects are deployed as written (tpl rendered); the chart's own get commonAnnotations.
    (settings,) = by_kind(objects, "ConfigMap").values()
    assert settings == {"apiVersion": "v1", "kind": "ConfigMap", "data": {"REPORTS_BUCKET": "reports"},
                        "metadata": {"name": "th-task-settings", "namespace": "jobs"}}
    for o in objects:
        if o is not settings:
            assert o["metadata"].get("annotations", {}).get("team.example/owner") == "payments", o["metadata"]["name"]
    sa = by_kind(objects, "ServiceAccount")["th-taskherd-default"]
    assert sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].endswith(":role/tasks")
    assert sa["automountServiceAccountToken"] is False
    worker = by_kind(objects, "Deployment")["th-taskherd-default"]
    pod = worker["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "th-taskherd-default"
    assert pod["automountServiceAccountToken"] is False
    (init,) = pod["initContainers"]
    assert init["name"] == "wait-for-schema"
    # Extra containers inherit the restricted security context.
    assert init["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                       "capabilities": {"drop": ["ALL"]}}
    assert [c["name"] for c in pod["containers"]] == [WORKER, "sidecar-log-shipper"]
    assert container(worker, WORKER)["image"] == "mirror.example:5000/worker:dev"


def test_exec_probes_are_one_switch_away():
    worker = by_kind(render(values={**BROKER, "workerPools": [{"name": "p", "app": "tasks", "probes": {
        "type": "exec", "readiness": {"periodSeconds": 10}}}]}), "Deployment")["th-taskherd-p"]
    c = container(worker, WORKER)
    for kind in ("startup", "readiness", "liveness"):
        probe = c[f"{kind}Probe"]
        assert probe["exec"]["command"] == ["taskherd", "probe", kind] and "httpGet" not in probe
    assert c["readinessProbe"]["periodSeconds"] == 10 and c["livenessProbe"]["terminationGracePeriodSeconds"] == 15


def test_beat_is_one_replica_recreated_with_liveness_on_its_loop():
    objects = render([CHART / "ci" / "rabbitmq-multipool-values.yaml"])
    beat = by_kind(objects, "Deployment")["th-taskherd-beat"]
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"] == {"type": "Recreate"}
    c = container(beat, "taskherd-beat")
    assert c["command"] == ["celery", "--app=shop.tasks", "beat", "--loglevel=INFO",
                            "--schedule=/run/taskherd/beat/celerybeat-schedule", "--max-interval=30"]
    # 3 x max interval + 30 s: the loop ticks at least every max interval.
    assert c["livenessProbe"]["exec"]["command"] == ["taskherd", "probe", "liveness", "--max-age", "120"]
    env = env_of(c)
    assert env["TASKHERD_QUEUES"] == "orders,emails"  # the fast pool's: beat publishes as its producers do
    assert env["TASKHERD_HEARTBEAT_DIR"] == "/run/taskherd/heartbeat"
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert {"/tmp", "/run/taskherd/heartbeat", "/run/taskherd/beat"} <= mounts
    # Beat, like the workers and the test pod, is under the app pods' NetworkPolicy.
    policy = by_kind(objects, "NetworkPolicy")["th-taskherd-worker"]["spec"]["podSelector"]
    assert policy["matchExpressions"] == [{"key": "app.kubernetes.io/component", "operator": "In",
                                           "values": ["worker", "beat", "test"]}]


def test_helm_test_pod_pings_the_first_pool_through_its_app():
    objects = render(values=BROKER)
    (test,) = by_kind(objects, "Pod").values()
    assert test["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert test["spec"]["restartPolicy"] == "Never"
    (c,) = test["spec"]["containers"]
    assert c["command"] == ["taskherd", "ping", "--app=tasks", "--queues=celery", "--timeout=120"]
    assert env_of(c)["TASKHERD_BROKER_URL"] == {"secretKeyRef": {"name": "celery-broker", "key": "url"}}


def test_long_names_keep_their_suffix_and_stay_distinct():
    """Names are cut to 63 characters from the prefix, never the suffix: two pools whose names differ
    only at the end keep two Deployments, WorkerPools and PDBs (truncating the whole name made them one)."""
    values = {**BROKER, "fullnameOverride": "a-release-name-that-is-long-enough-to-fill-most-of-the-63-chars",
              "workerPools": [{"name": "reports-nightly-a", "app": "a", "queues": ["a"]},
                              {"name": "reports-nightly-b", "app": "a", "queues": ["b"]}]}
    objects = render(values=values)
    for kind in ("Deployment", "WorkerPool", "PodDisruptionBudget"):
        names = [n for n in by_kind(objects, kind) if "reports" in n]
        assert len(names) == 2 and all(len(n) <= 63 for n in names), names
        assert {n[-17:] for n in names} == {"reports-nightly-a", "reports-nightly-b"}
    operator = [n for n in by_kind(objects, "Deployment") if n.endswith("-operator")]
    assert len(operator) == 1 and len(operator[0]) <= 63


def documented_pod_labels() -> dict[str, str]:
    """The label table under **Pod labels.** in docs/chart.md: label -> where it is."""
    text = (CHART.parents[1] / "docs" / "chart.md").read_text()
    table = text.split("**Pod labels.**", 1)[1].split("\n\n", 2)[1]
    rows = [line.split("|")[1:-1] for line in table.splitlines()[2:]]
    return {cells[0].strip().strip("`"): cells[2].strip() for cells in rows}


def test_worker_pod_labels_are_the_ones_docs_chart_md_lists():
    values = {**BROKER, "workerPools": [{"name": "payments", "app": "a", "podLabels": {"team": "pay"}}],
              "beat": {"enabled": True}}
    deployments = by_kind(render(values=values), "Deployment")
    documented = documented_pod_labels()
    worker = deployments["th-taskherd-payments"]["spec"]["template"]["metadata"]["labels"]
    assert worker == {"app.kubernetes.io/name": "taskherd", "app.kubernetes.io/instance": "th",
                      "app.kubernetes.io/component": "worker", "taskherd.io/pool": "payments", "team": "pay"}
    assert set(worker) - {"team"} == set(documented)
    for name in ("beat", "operator", "exporter"):
        labels = deployments[f"th-taskherd-{name}"]["spec"]["template"]["metadata"]["labels"]
        assert labels["app.kubernetes.io/component"] == name
        assert set(labels) == {k for k, where in documented.items() if where == "every pod of the chart"}


def test_workers_boot_without_mingle_and_gossip_unless_a_pool_asks_for_them():
    # mingle waits a second for replies on every boot (bench/worker_boot.py), gossip costs every
    # worker the events of every other: both off unless asked for, per pool or in the defaults.
    values = {**BROKER, "workerPoolDefaults": {"gossip": True}, "workerPools": [
        {"name": "plain", "app": "a", "queues": ["plain"]},
        {"name": "revokes", "app": "a", "queues": ["revokes"], "mingle": True, "gossip": False}]}
    deployments = by_kind(render(values=values), "Deployment")
    plain = container(deployments["th-taskherd-plain"], WORKER)["command"]
    revokes = container(deployments["th-taskherd-revokes"], WORKER)["command"]
    assert "--without-mingle" in plain and "--without-gossip" not in plain
    assert "--without-mingle" not in revokes and "--without-gossip" in revokes
    refused = render_error(values={**BROKER, "workerPools": [{"name": "p", "app": "a", "extraArgs": ["--without-mingle"]}]})
    assert 'workerPools[0].extraArgs[0]="--without-mingle" is refused: set mingle instead' in refused


def test_taskherd_worker_takes_every_option_the_chart_renders():
    # `taskherd worker` hands a command line with an option it does not know to Celery's own (and
    # its start-up cost): nothing the chart derives from values may send every pod down that path.
    from taskherd.commands.worker import parser, worker_options

    values = {**BROKER, "workerPools": [
        {"name": "every", "app": "shop.tasks:app", "queues": ["a", "b"], "concurrency": 3, "logLevel": "DEBUG",
         "maxTasksPerChild": 50, "maxMemoryPerChildKb": 200000, "timeLimits": {"softSeconds": 50, "hardSeconds": 60},
         "resources": {"limits": {"memory": "1Gi"}}},  # 3 children x 200000 KiB fit in it
        {"name": "chatty", "app": "shop.tasks", "queues": ["c"], "mingle": True, "gossip": True,
         "extraArgs": ["-O", "fair", "--without-heartbeat"]}]}
    deployments = by_kind(render(values=values), "Deployment")
    every = container(deployments["th-taskherd-every"], WORKER)["command"]
    chatty = container(deployments["th-taskherd-chatty"], WORKER)["command"]
    for command in (every, chatty):
        assert command[:2] == ["taskherd", "worker"]
        _, unknown = parser().parse_known_args(command[2:])
        assert unknown == [], command
    assert worker_options(parser().parse_args(every[2:])) == {
        "queues": ["a", "b"], "concurrency": 3, "loglevel": "DEBUG", "soft_time_limit": 50.0, "time_limit": 60.0,
        "max_tasks_per_child": 50, "max_memory_per_child": 200000, "without_mingle": True, "without_gossip": True}
    assert worker_options(parser().parse_args(chatty[2:]))["optimization"] == "fair"


def test_a_pool_declaring_a_longer_consumer_timeout_may_run_longer_tasks_on_rabbitmq():
    # The refusal compares the hard limit with the consumer_timeout the worker is given, not 1800.
    values = {"broker": {"type": "rabbitmq", "existingSecret": {"name": "celery-broker"}}, "workerPools": [
        {"name": "long", "app": "a", "timeLimits": {"softSeconds": 3000, "hardSeconds": 3500},
         "env": [{"name": "TASKHERD_RABBITMQ_CONSUMER_TIMEOUT", "value": "3600"}]}]}
    worker = container(by_kind(render(values=values), "Deployment")["th-taskherd-long"], WORKER)
    assert env_of(worker)["TASKHERD_TIME_LIMIT"] == "3500"
    assert env_of(worker)["TASKHERD_RABBITMQ_CONSUMER_TIMEOUT"] == "3600"


def test_extra_containers_keep_their_own_false_and_get_the_chart_s_restrictions():
    # sprig's merge took readOnlyRootFilesystem: false for "unset" and put the chart's true over it.
    values = {**BROKER, "workerPools": [{"name": "p", "app": "a",
        "initContainers": [{"name": "migrate", "image": "app:1", "securityContext": {
            "readOnlyRootFilesystem": False, "capabilities": {"add": ["NET_BIND_SERVICE"]}}}],
        "sidecars": [{"name": "shipper", "image": "bit:3"}]}]}
    pod = by_kind(render(values=values), "Deployment")["th-taskherd-p"]["spec"]["template"]["spec"]
    assert pod["initContainers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": False,
        "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}
    shipper = next(c for c in pod["containers"] if c["name"] == "shipper")
    assert shipper["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                          "capabilities": {"drop": ["ALL"]}}


def test_a_release_name_with_a_dot_gives_a_valid_service_name():
    # Helm takes `shop.v2`; a Service name is a DNS-1035 label (no dots).
    values = {**BROKER, "monitoring": {"serviceMonitor": {"enabled": True}},
              "networkPolicy": {"metricsIngress": {"enabled": True}}}
    services = by_kind(render(values=values, release="shop.v2"), "Service")
    assert list(services) == ["shop-v2-taskherd-operator-metrics"]


def test_known_resource_names_and_byte_sizes_render():
    resources = {"requests": {"cpu": "250m", "memory": "1G", "ephemeral-storage": "2Gi", "hugepages-2Mi": "64Mi",
                              "nvidia.com/gpu": 1},
                 "limits": {"memory": "1Gi", "hugepages-2Mi": "64Mi", "nvidia.com/gpu": 1}}
    values = {**BROKER, "workerPools": [{"name": "p", "app": "a", "resources": resources, "scratchSizeLimit": "16Mi"}]}
    worker = container(by_kind(render(values=values), "Deployment")["th-taskherd-p"], WORKER)
    assert worker["resources"] == resources


def test_one_operator_replica_may_run_without_leader_election():
    values = {**BROKER, "operator": {"replicas": 1, "extraArgs": ["--no-leader-election"],
                                     "env": [{"name": "TASKHERD_LEADER_ELECTION", "value": "false"}]}}
    operator = by_kind(render(values=values), "Deployment")["th-taskherd-operator"]
    assert operator["spec"]["replicas"] == 1
    assert "--no-leader-election" in operator["spec"]["template"]["spec"]["containers"][0]["args"]


def test_operator_and_beat_extra_args_the_chart_does_not_set_render():
    # The checks refuse what the chart sets (ports, namespaces, the schedule file), abbreviated or
    # joined to its value; the rest reaches the command line as written.
    values = {**BROKER, "operator": {"replicas": 1, "extraArgs": ["--dry-run", "--no-leader-election"]},
              "beat": {"enabled": True, "extraArgs": ["--loglevel=DEBUG", "--scheduler", "redbeat.RedBeatScheduler"]}}
    deployments = by_kind(render(values=values), "Deployment")
    args = container(deployments["th-taskherd-operator"], "taskherd-operator")["args"]
    assert args[-2:] == ["--dry-run", "--no-leader-election"]
    assert "--metrics-port=9893" in args and "--liveness=http://0.0.0.0:9894/healthz" in args
    beat = container(deployments["th-taskherd-beat"], "taskherd-beat")["command"]
    assert beat[-3:] == ["--loglevel=DEBUG", "--scheduler", "redbeat.RedBeatScheduler"]


def test_the_namespace_default_service_account_may_be_used_but_not_created():
    values = {**BROKER, "workerPools": [
        {"name": "a", "app": "t", "queues": ["a"], "serviceAccount": {"create": False, "name": "default"}},
        {"name": "b", "app": "t", "queues": ["b"], "serviceAccount": {"create": True, "name": "tasks"}}]}
    objects = render(values=values)
    deployments = by_kind(objects, "Deployment")
    assert deployments["th-taskherd-a"]["spec"]["template"]["spec"]["serviceAccountName"] == "default"
    assert deployments["th-taskherd-b"]["spec"]["template"]["spec"]["serviceAccountName"] == "tasks"
    assert "default" not in by_kind(objects, "ServiceAccount")


def test_children_memory_caps_that_fit_the_limit_together_render():
    # concurrency x maxMemoryPerChildKb may reach the limit, not pass it: 4 x 131072 KiB = 512Mi.
    values = {**BROKER, "workerPools": [{"name": "p", "app": "t", "concurrency": 4, "maxMemoryPerChildKb": 131072}]}
    worker = container(by_kind(render(values=values), "Deployment")["th-taskherd-p"], WORKER)
    assert "--concurrency=4" in worker["command"] and "--max-memory-per-child=131072" in worker["command"]
    assert worker["resources"]["limits"]["memory"] == "512Mi"


def test_a_startup_budget_of_the_documented_minimum_renders():
    # periodSeconds x failureThreshold >= 60 s (docs/chart.md, the startup probe): 2 x 30 is accepted.
    values = {**BROKER, "workerPools": [{"name": "p", "app": "t", "probes": {
        "type": "exec", "startup": {"periodSeconds": 2, "failureThreshold": 30}}}]}
    worker = container(by_kind(render(values=values), "Deployment")["th-taskherd-p"], WORKER)
    assert worker["startupProbe"]["periodSeconds"] == 2 and worker["startupProbe"]["failureThreshold"] == 30
