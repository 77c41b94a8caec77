"""The values `make demo` installs the chart with (examples/shop/values.yaml plus this machine),
rendered by the real helm against the chart's schema and validateValues, for both brokers."""
import subprocess
from pathlib import Path

import pytest
import yaml

from e2e.demo import deploy, environment
from e2e.demo.config import CHART
from e2e.lib import cluster as clusters
from e2e.services.endpoints import Credentials, in_cluster, on_host

CREDENTIALS = Credentials(username="taskherd", password="secret", redis_password="redis-secret")


def render(broker: str, tmp_path: Path) -> list[dict]:
    pods = in_cluster(CREDENTIALS)
    host = on_host(CREDENTIALS, {"redis": {"redis": 40001}, "rabbitmq": {"amqp": 40002, "management": 40003},
                                 "postgres": {"postgres": 40004}, "alertmanager": {"http": 40005}})
    world = environment.World(broker=broker, host=environment.endpoints(host, broker, 15),
                              pods=environment.endpoints(pods, broker, 15))
    values = tmp_path / f"{broker}.yaml"
    values.write_text(yaml.safe_dump(deploy.demo_values(world)))
    helm = clusters.helm_path()
    if not Path(helm).exists():
        pytest.fail(f"helm not found at {helm}: run `make cluster-binaries`")
    r = subprocess.run([helm, "template", "shop", str(CHART), "--namespace", "taskherd-demo",
                        "--kube-version", "1.34.0", "-f", str(values)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_demo_values_render_a_pool_running_the_shop(broker, tmp_path):
    docs = render(broker, tmp_path)
    [deployment] = [d for d in docs if d["kind"] == "Deployment"
                    and d["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component") == "worker"]
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert "--app=shop.app" in container["command"] and "--queues=shop" in container["command"]
    env = {e["name"]: e for e in container["env"]}
    assert env["SHOP_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {"name": "shop-database", "key": "dsn"}
    assert env["TASKHERD_BROKER_URL"]["valueFrom"]["secretKeyRef"]["name"] == "shop-broker"
    assert env["PYTHONPATH"]["value"] == "/app"
    assert {"name": "shop-code", "configMap": {"name": "shop-code"}} in pod["volumes"]
    assert container["resources"]["limits"]["memory"] == "320Mi"
    assert pod["terminationGracePeriodSeconds"] == 45  # hard 30 + drain margin 10 + shutdown 5
    [pool] = [d for d in docs if d["kind"] == "WorkerPool"]
    assert pool["spec"]["broker"]["type"] == broker
    assert pool["spec"]["deadLetter"]["alertmanagerUrl"] == "http://alertmanager.taskherd-services.svc:9093"
    assert (pool["spec"]["minReplicas"], pool["spec"]["maxReplicas"]) == (1, 6)


@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_demo_pods_reach_the_services_by_name_and_only_them(broker, tmp_path):
    """The Secrets name the in-cluster Services, and the NetworkPolicies open exactly their ports
    towards the services' pods: nothing points at this host."""
    world = environment.World(broker=broker, host=environment.endpoints(in_cluster(CREDENTIALS), broker, 15),
                              pods=environment.endpoints(in_cluster(CREDENTIALS), broker, 15))
    expected_broker = ("redis://:redis-secret@redis.taskherd-services.svc:6379/15" if broker == "redis"
                       else "amqp://taskherd:secret@rabbitmq.taskherd-services.svc:5672/taskherd-demo")
    assert world.pods.broker_url == expected_broker
    assert world.pods.database_url == "postgresql://taskherd:secret@postgres.taskherd-services.svc:5432/taskherd_demo"
    docs = render(broker, tmp_path)
    policies = {d["metadata"]["name"]: d for d in docs if d["kind"] == "NetworkPolicy"}
    egress = [rule for p in policies.values() for rule in p["spec"].get("egress", [])]
    service_rules = [r for r in egress if any("namespaceSelector" in peer and peer["namespaceSelector"].get(
        "matchLabels", {}).get("kubernetes.io/metadata.name") == "taskherd-services" for peer in r.get("to", []))]
    reached = {(peer["podSelector"]["matchLabels"]["app.kubernetes.io/name"], port["port"])
               for r in service_rules for peer in r["to"] for port in r.get("ports", [])}
    broker_ports = {("redis", 6379)} if broker == "redis" else {("rabbitmq", 5672), ("rabbitmq", 15672), ("redis", 6379)}
    assert reached == broker_ports | {("postgres", 5432), ("alertmanager", 9093)}
    assert not any("ipBlock" in peer for r in egress for peer in r.get("to", []))
