"""The values `make demo` installs the chart with (examples/shop/values.yaml plus this machine),
rendered by the real helm against the chart's schema and validateValues, for both brokers."""
import subprocess
from pathlib import Path

import pytest
import yaml

from e2e.demo import deploy, environment
from e2e.demo.config import CHART
from e2e.lib import cluster as clusters


def render(broker: str, tmp_path: Path) -> list[dict]:
    world = environment.World(broker=broker, pod_address="172.28.0.1",
                              host=environment.endpoints("127.0.0.1", broker, 15),
                              pods=environment.endpoints("172.28.0.1", broker, 15), forwarded_ports=())
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
    assert pool["spec"]["deadLetter"]["alertmanagerUrl"] == "http://172.28.0.1:9393"
    assert (pool["spec"]["minReplicas"], pool["spec"]["maxReplicas"]) == (1, 6)
