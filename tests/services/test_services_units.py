"""The in-cluster services' pure parts: settings, manifests, rollout accounting, URLs, the Redis
database registry's choice. The cluster tests (test_services_cluster.py) run the real thing."""
import pytest
import yaml

from e2e.services import manifests
from e2e.services.config import COMPONENTS, PORTS, Settings, SettingsError, merge_settings
from e2e.services.endpoints import Credentials, in_cluster, on_host
from e2e.services.rollout import rollout_of
from e2e.services.tenants import TenantError, choose_database, lease_redis_database

CREDENTIALS = Credentials(username="taskherd", password="pw", redis_password="rpw")


def statefulsets(objects):
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == "StatefulSet"}


@pytest.mark.parametrize("kwargs, named", [
    ({"rabbitmq_nodes": 2}, "rabbitmq_nodes=2: must be one of 1, 3, 5"),
    ({"prometheus_namespaces": ("Shop",)}, "prometheus_namespaces=['Shop']"),
    ({"components": ("redis", "mysql")}, "components=['redis', 'mysql']: each must be one of redis, rabbitmq"),
    ({"components": ()}, "components=[]"),
])
def test_bad_settings_are_refused_naming_the_setting_and_what_is_valid(kwargs, named):
    with pytest.raises(SettingsError, match=None) as error:
        Settings(**kwargs)
    assert named in str(error.value)


def test_settings_not_asked_for_keep_what_is_deployed():
    deployed = Settings(rabbitmq_nodes=3, prometheus_namespaces=("shop",))
    assert merge_settings(deployed, {"rabbitmq_nodes": None, "components": None}) == deployed
    assert merge_settings(deployed, {"rabbitmq_nodes": 1}).rabbitmq_nodes == 1
    assert merge_settings(deployed, {"rabbitmq_nodes": 1}).prometheus_namespaces == ("shop",)
    assert merge_settings(None, {}) == Settings()
    assert Settings.from_json(deployed.to_json()) == deployed
    with pytest.raises(SettingsError, match="unknown settings \\['rabbit_nodes'\\]"):
        merge_settings(None, {"rabbit_nodes": 3})


@pytest.mark.parametrize("storage_class", [None, "standard"])
def test_every_pod_meets_the_restricted_pod_security_standard(storage_class):
    objects = manifests.render(Settings(rabbitmq_nodes=3), image="img:1", storage_class=storage_class)
    namespace = objects[0]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for name, sts in statefulsets(objects).items():
        pod = sts["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert not any(k in pod for k in ("hostNetwork", "hostPID", "hostIPC"))
        assert not any("hostPath" in v for v in pod["volumes"])
        [container] = pod["containers"]
        assert container["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
        assert container["readinessProbe"], name


def test_each_component_has_a_service_of_its_name_on_its_container_ports():
    objects = manifests.render(Settings(), image="img:1")
    services = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Service"}
    for name, sts in statefulsets(objects).items():
        [container] = sts["spec"]["template"]["spec"]["containers"]
        container_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        service_ports = {p["name"]: p["port"] for p in services[name]["spec"]["ports"]}
        assert service_ports == PORTS[name] and all(container_ports[n] == p for n, p in PORTS[name].items())
        assert services[name]["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    assert set(statefulsets(objects)) == set(COMPONENTS)
    nodes = services["rabbitmq-nodes"]["spec"]
    assert nodes["clusterIP"] == "None" and nodes["publishNotReadyAddresses"] is True


def test_data_lives_on_a_claim_with_a_storage_class_else_on_an_empty_dir():
    with_class = statefulsets(manifests.render(Settings(), image="img:1", storage_class="standard"))["redis"]
    without = statefulsets(manifests.render(Settings(), image="img:1", storage_class=None))["redis"]
    [claim] = with_class["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data" and claim["spec"]["storageClassName"] == "standard"
    assert not any(v["name"] == "data" for v in with_class["spec"]["template"]["spec"]["volumes"])
    assert without["spec"]["volumeClaimTemplates"] == []
    assert {"name": "data", "emptyDir": {}} in without["spec"]["template"]["spec"]["volumes"]


def test_a_change_the_api_cannot_apply_in_place_changes_the_shape_and_an_image_change_does_not():
    def shape(settings=Settings(), image="img:1", storage_class=None, name="rabbitmq"):
        sts = statefulsets(manifests.render(settings, image=image, storage_class=storage_class))[name]
        return sts["metadata"]["annotations"][manifests.SHAPE_ANNOTATION]
    assert shape() == shape(image="img:2")
    assert shape() != shape(storage_class="standard")
    assert shape() != shape(Settings(rabbitmq_nodes=3))
    assert shape(name="redis") == shape(Settings(rabbitmq_nodes=3), name="redis")


def test_rabbitmq_cluster_nodes_start_together_and_know_their_count():
    sts = statefulsets(manifests.render(Settings(rabbitmq_nodes=3), image="img:1"))["rabbitmq"]
    assert sts["spec"]["replicas"] == 3 and sts["spec"]["podManagementPolicy"] == "Parallel"
    assert sts["spec"]["serviceName"] == "rabbitmq-nodes"
    env = {e["name"]: e for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["RABBITMQ_NODES"]["value"] == "3"
    assert env["RABBITMQ_ERLANG_COOKIE"]["valueFrom"]["secretKeyRef"] == {"name": "taskherd-services",
                                                                          "key": "erlang-cookie"}


def test_prometheus_discovers_pods_in_the_namespaces_it_is_told_and_sends_alerts_to_alertmanager():
    told = yaml.safe_load(manifests.prometheus_config(Settings(prometheus_namespaces=("shop", "pay")), "svc"))
    everywhere = yaml.safe_load(manifests.prometheus_config(Settings(), "svc"))
    [job] = told["scrape_configs"]
    assert job["kubernetes_sd_configs"] == [{"role": "pod", "namespaces": {"names": ["shop", "pay"]}}]
    assert everywhere["scrape_configs"][0]["kubernetes_sd_configs"] == [{"role": "pod"}]
    assert {"source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": "metrics",
            "action": "keep"} in job["relabel_configs"]
    assert told["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["alertmanager.svc.svc:9093"]


def test_a_config_change_rolls_prometheus_and_nothing_else():
    def hashes(settings):
        return {n: s["spec"]["template"]["metadata"]["annotations"].get(manifests.CONFIG_HASH_ANNOTATION)
                for n, s in statefulsets(manifests.render(settings, image="img:1")).items()}
    before, after = hashes(Settings()), hashes(Settings(prometheus_namespaces=("shop",)))
    assert [n for n in before if before[n] != after[n]] == ["prometheus"]


def _pod(name, revision, ready, waiting=None, restarts=0):
    state = {"waiting": {"reason": waiting}} if waiting else {"running": {}}
    return {"metadata": {"name": name, "labels": {"controller-revision-hash": revision}},
            "status": {"phase": "Running",
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                       "containerStatuses": [{"ready": ready, "restartCount": restarts, "state": state}]}}


def _sts(replicas, revision="r2", generation=2, observed=2):
    return {"metadata": {"generation": generation}, "spec": {"replicas": replicas},
            "status": {"updateRevision": revision, "observedGeneration": observed}}


def test_rollout_is_done_when_every_pod_runs_the_current_revision_and_is_ready():
    assert rollout_of("redis", _sts(1), [_pod("redis-0", "r2", True)]).done
    old = rollout_of("redis", _sts(1), [_pod("redis-0", "r1", True)])
    assert not old.done and old.summary == "0/1 ready: redis-0 old revision, Running"
    crash = rollout_of("rabbitmq", _sts(3), [_pod("rabbitmq-0", "r2", True), _pod("rabbitmq-1", "r2", True),
                                             _pod("rabbitmq-2", "r2", False, "CrashLoopBackOff", 3)])
    assert not crash.done and crash.summary == "2/3 ready: rabbitmq-2 CrashLoopBackOff (restarts 3)"
    assert rollout_of("redis", _sts(1, observed=1), [_pod("redis-0", "r2", True)]).summary \
        == "1/1 ready: the controller has not seen the new spec yet"
    assert rollout_of("redis", None, []).summary == "no StatefulSet yet"


def test_urls_name_the_services_for_pods_and_the_forwarded_ports_for_this_host():
    pods = in_cluster(CREDENTIALS, namespace="svc")
    assert pods.redis_db(3) == "redis://:rpw@redis.svc.svc:6379/3"
    assert pods.amqp_vhost("my app") == "amqp://taskherd:pw@rabbitmq.svc.svc:5672/my%20app"
    assert pods.management == "http://taskherd:pw@rabbitmq.svc.svc:15672"
    assert pods.database("shop") == "postgresql://taskherd:pw@postgres.svc.svc:5432/shop"
    host = on_host(CREDENTIALS, {"redis": {"redis": 41000}})
    assert host.redis_db(0) == "redis://:rpw@127.0.0.1:41000/0" and host.amqp is None
    with pytest.raises(LookupError, match="amqp: that service is not deployed or not forwarded"):
        host.amqp_vhost("/")
    with pytest.raises(ValueError, match="Redis database index 16: must be 0-15"):
        pods.redis_db(16)


def test_an_owner_keeps_its_redis_database_and_a_new_owner_gets_the_lowest_free_one():
    assert choose_database({}, "demo") == (1, False)
    assert choose_database({1: "a", 2: "demo"}, "demo") == (2, True)
    assert choose_database({1: "a", 3: "b"}, "demo") == (2, False)
    assert choose_database({i: f"o{i}" for i in range(1, 16)}, "demo") == (None, False)


def test_an_invalid_owner_name_is_refused_before_any_connection():
    with pytest.raises(TenantError, match="owner 'my app'"):
        lease_redis_database("redis://127.0.0.1:1/0", "my app")
