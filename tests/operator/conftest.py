"""Fixtures for the operator's tests against the REAL API server (marker `cluster`).

The operator runs as a host process (`python -m taskherd.operator`) with the cluster's kubeconfig,
so it reaches the host's Redis and Alertmanager on loopback and the pods over the node bridge.
An unreachable cluster FAILS these tests with the exact error; nothing is skipped.
"""
from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

CRD = REPO_ROOT / "charts" / "taskherd" / "crds" / "workerpools.taskherd.io.yaml"
TEST_LABEL = "taskherd.io/test"
TEST_LABEL_VALUE = "operator"


@pytest.fixture(scope="session")
def cluster():
    from e2e.lib import cluster as clusterlib

    c = clusterlib.resolve()
    try:
        c.check_reachable()
    except clusterlib.ClusterUnavailable as e:
        pytest.fail(str(e), pytrace=False)
    c.kubectl("delete", "namespace", "-l", f"{TEST_LABEL}={TEST_LABEL_VALUE}", "--wait=false",
              "--ignore-not-found", check=False)
    c.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    c.kubectl("wait", "--for=condition=Established", "crd/workerpools.taskherd.io", "--timeout=60s")
    return c


@pytest.fixture(scope="session")
def pod_image(cluster) -> tuple[str, str]:
    """A Debian image with python3 for the stand-in workers (the worker image is not needed: the
    operator only reads their metrics endpoint)."""
    return cluster.test_image()


@pytest.fixture
def namespace(cluster, request) -> str:
    name = cluster.create_test_namespace("op", request.node.name, {TEST_LABEL: TEST_LABEL_VALUE})
    yield name
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        events = cluster.kubectl("-n", name, "get", "events", "--sort-by=.lastTimestamp", check=False).stdout
        print(f"--- events in {name} ---\n{events[-4000:]}")
    cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


RBAC_DOC = REPO_ROOT / "operator" / "taskherd" / "operator" / "rbac.md"


def rbac_roles() -> str:
    """The YAML block of rbac.md: the exact Roles the operator documents."""
    text = RBAC_DOC.read_text()
    return text.split("```yaml", 1)[1].split("```", 1)[0]


def service_account_kubeconfig(cluster, namespace: str, directory: Path) -> Path:
    """A kubeconfig for a ServiceAccount bound to exactly the Roles of rbac.md."""
    import yaml

    cluster.apply(rbac_roles(), namespace)
    cluster.apply(f"""
apiVersion: v1
kind: ServiceAccount
metadata: {{name: taskherd-operator}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: taskherd-operator}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: taskherd-operator}}
subjects: [{{kind: ServiceAccount, name: taskherd-operator, namespace: {namespace}}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: taskherd-operator-leader}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: taskherd-operator-leader}}
subjects: [{{kind: ServiceAccount, name: taskherd-operator, namespace: {namespace}}}]
""", namespace)
    token = cluster.kubectl("-n", namespace, "create", "token", "taskherd-operator", "--duration=1h").stdout.strip()
    admin_path = Path(cluster.kubeconfig)
    admin = yaml.safe_load(admin_path.read_text())
    server = dict(admin["clusters"][0]["cluster"])
    if "certificate-authority" in server:
        server["certificate-authority"] = str((admin_path.parent / server["certificate-authority"]).resolve())
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "sa",
              "clusters": [{"name": "c", "cluster": server}],
              "users": [{"name": "sa", "user": {"token": token}}],
              "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa", "namespace": namespace}}]}
    path = directory / f"sa-{namespace}.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


class OperatorProcess:
    def __init__(self, cluster, namespace: str, log_path: Path, *, leader_election: bool = True,
                 kubeconfig: Path | None = None, dry_run: bool = False):
        self.liveness_port = free_port()
        self.log_path = log_path
        env = {**cluster.env(), "POD_NAMESPACE": namespace, "TASKHERD_WATCH_NAMESPACES": namespace,
               "PYTHONUNBUFFERED": "1"}
        if kubeconfig is not None:
            env["KUBECONFIG"] = str(kubeconfig)
        args = [sys.executable, "-m", "taskherd.operator", "--metrics-port", "0",
                "--liveness", f"http://127.0.0.1:{self.liveness_port}/healthz"]
        if not leader_election:
            args.append("--no-leader-election")
        if dry_run:
            args.append("--dry-run")
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(args, env=env, stdout=self._log, stderr=subprocess.STDOUT, cwd=str(REPO_ROOT))

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig_kill: bool = False) -> None:
        if self.proc.poll() is None:
            (self.proc.kill if sig_kill else self.proc.terminate)()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


@pytest.fixture
def operator_factory(cluster, tmp_path, request):
    started: list[OperatorProcess] = []

    def start(namespace: str, *, as_service_account: bool = True, **kwargs) -> OperatorProcess:
        """The operator as a host process, by default with only the permissions of rbac.md."""
        if as_service_account:
            kwargs["kubeconfig"] = service_account_kubeconfig(cluster, namespace, tmp_path)
        op = OperatorProcess(cluster, namespace, tmp_path / f"operator-{len(started)}.log", **kwargs)
        started.append(op)
        return op

    yield start
    for op in started:
        op.stop()
        failed = getattr(request.node, "rep_call", None)
        if failed is not None and failed.failed:
            print(f"--- {op.log_path} (last lines) ---\n{op.log()[-6000:]}")
