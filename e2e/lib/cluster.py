"""Which Kubernetes cluster the e2e tests run against, and small helpers to drive it.

``E2E_CLUSTER`` chooses (:func:`selected_source`):

* ``explicit``: the kubeconfig in ``TASKHERD_KUBECONFIG``, else ``KUBECONFIG`` (any cluster a user
  points us at);
* ``kind``: the ``taskherd`` kind cluster of e2e/kind (``make kind-cluster``; see :mod:`e2e.lib.kind`),
  brought up if needed, with the node image built here (``make kind-image``) unless
  ``TASKHERD_KIND_NODE_IMAGE`` names another; kubeconfig ``$TASKHERD_HOME/kind/kubeconfig``;
* ``local``: the local cluster of ``make cluster``: ``$TASKHERD_HOME/cluster/admin.kubeconfig``.

Unset, the first that applies: an explicit kubeconfig; kind, when a ``kind`` binary and a pulled
``kindest/node`` image in the environment's docker are both present (the path of users with a
registry); the local cluster.

kubectl and helm are the ones built by ``make cluster-binaries`` (pinned in
e2e/cluster/versions.env), never whatever else is on PATH, unless ``TASKHERD_KUBECTL`` /
``TASKHERD_HELM`` say otherwise.

Only the standard library is used. Waits are bounded, log their progress and raise
:class:`WaitTimeout` with the last thing they saw.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

log = logging.getLogger("taskherd.e2e.cluster")

from . import kind as kindlib

REPO_ROOT = Path(__file__).resolve().parents[2]
VERSIONS_FILE = REPO_ROOT / "e2e" / "cluster" / "versions.env"
KIND_CLUSTER_NAME = kindlib.CLUSTER_NAME
#: the values E2E_CLUSTER accepts
SOURCES = ("explicit", "kind", "local")


class ClusterUnavailable(RuntimeError):
    """The selected cluster cannot be reached; the message says why, verbatim."""


class CommandFailed(RuntimeError):
    """kubectl or helm failed; the message carries the command and its stderr."""

    def __init__(self, message: str, result: subprocess.CompletedProcess):
        super().__init__(message)
        self.result = result


class WaitTimeout(TimeoutError):
    """A bounded wait ran out; the message says what was awaited and what was last seen."""


def versions() -> dict[str, str]:
    out = {}
    for line in VERSIONS_FILE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            out[k] = v
    return out


def taskherd_home() -> Path:
    return Path(os.environ.get("TASKHERD_HOME") or Path.home() / ".cache" / "taskherd")


def local_kubeconfig() -> Path:
    """Where `make cluster` writes the local cluster's admin kubeconfig."""
    return taskherd_home() / "cluster" / "admin.kubeconfig"


def kubectl_path() -> str:
    if os.environ.get("TASKHERD_KUBECTL"):
        return os.environ["TASKHERD_KUBECTL"]
    return str(taskherd_home() / "bin" / f"kubernetes-{versions()['KUBERNETES_VERSION']}" / "kubectl")


def helm_path() -> str:
    if os.environ.get("TASKHERD_HELM"):
        return os.environ["TASKHERD_HELM"]
    return str(taskherd_home() / "bin" / f"helm-{versions()['HELM_VERSION']}" / "helm")


def kind_path() -> str | None:
    return kindlib.kind_binary()


@dataclass(frozen=True)
class Cluster:
    source: str  # "explicit", "kind" or "local"
    kubeconfig: str
    kubectl_bin: str
    helm_bin: str

    @property
    def is_local(self) -> bool:
        return self.source == "local"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["KUBECONFIG"] = self.kubeconfig
        helm_home = taskherd_home() / "helm"
        env.setdefault("HELM_CACHE_HOME", str(helm_home / "cache"))
        env.setdefault("HELM_CONFIG_HOME", str(helm_home / "config"))
        env.setdefault("HELM_DATA_HOME", str(helm_home / "data"))
        return env

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 60) -> subprocess.CompletedProcess:
        """Run kubectl; on failure (with check) raise with the command and its stderr."""
        return _run([self.kubectl_bin, "--kubeconfig", self.kubeconfig, *args],
                    env=self.env(), input=input, check=check, timeout=timeout)

    def kubectl_json(self, *args: str, timeout: float = 60) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json", timeout=timeout).stdout)

    def apply(self, manifest: str, namespace: str | None = None) -> None:
        ns = ["-n", namespace] if namespace else []
        self.kubectl(*ns, "apply", "-f", "-", input=manifest)

    def helm(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        return _run([self.helm_bin, "--kubeconfig", self.kubeconfig, *args],
                    env=self.env(), check=check, timeout=timeout)

    def test_image(self) -> tuple[str, str]:
        """(image, imagePullPolicy) of a Debian image with a shell and python3 for test pods:
        TASKHERD_TEST_IMAGE when set, else the debootstrap base that `make cluster` imports."""
        if os.environ.get("TASKHERD_TEST_IMAGE"):
            return os.environ["TASKHERD_TEST_IMAGE"], "IfNotPresent"
        return versions()["BASE_IMAGE"], "Never" if self.is_local else "IfNotPresent"

    def create_test_namespace(self, prefix: str, test_name: str, labels: dict[str, str]) -> str:
        """A fresh namespace named after the test and labelled for cleanup, returned once its
        default ServiceAccount exists (the API creates it asynchronously and pods need it)."""
        base = "".join(ch if ch.isalnum() else "-" for ch in test_name.lower())[:30].strip("-")
        name = f"{prefix}-{base}-{uuid.uuid4().hex[:6]}"
        label_lines = "".join(f"\n    {key}: {value}" for key, value in labels.items())
        self.apply(f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n  labels:{label_lines}\n")
        wait_for(f"default ServiceAccount in {name}",
                 lambda: self.kubectl("-n", name, "get", "sa", "default", check=False).returncode == 0,
                 timeout=60, interval=0.5)
        return name

    def check_reachable(self) -> None:
        """Raise ClusterUnavailable with the exact error when the API server is not ready."""
        if not Path(self.kubectl_bin).is_file():
            raise ClusterUnavailable(
                f"kubectl not found at {self.kubectl_bin}: run `make cluster-binaries` (or `make cluster`)"
            )
        if not Path(self.kubeconfig).is_file():
            raise ClusterUnavailable(f"kubeconfig {self.kubeconfig} ({self.source} cluster) does not exist"
                                     + _make_cluster_hint(self))
        r = self.kubectl("get", "--raw", "/readyz", check=False, timeout=30)
        if r.returncode != 0 or r.stdout.strip() != "ok":
            raise ClusterUnavailable(
                f"{self.source} cluster ({self.kubeconfig}) is not ready: "
                f"{(r.stderr or r.stdout).strip()}" + _make_cluster_hint(self)
            )


def _make_cluster_hint(c: Cluster) -> str:
    if not c.is_local:
        return ""
    up_log = taskherd_home() / "cluster-up.log"
    if up_log.is_file():
        tail = "\n".join(up_log.read_text(errors="replace").splitlines()[-25:])
        return f"\n`make cluster` output ({up_log}), last lines:\n{tail}"
    return "\nstart it with `make cluster`"


def _run(cmd: Sequence[str], *, env: dict[str, str], input: str | None = None, check: bool,
         timeout: float) -> subprocess.CompletedProcess:
    r = subprocess.run(list(cmd), input=input, capture_output=True, text=True, env=env, timeout=timeout)
    if check and r.returncode != 0:
        shown = " ".join(cmd)
        raise CommandFailed(f"`{shown}` exited {r.returncode}: {(r.stderr or r.stdout).strip()}", r)
    return r


def selected_source() -> str:
    """Which cluster resolve() would use ("explicit", "kind" or "local"), without side effects."""
    chosen = os.environ.get("E2E_CLUSTER", "")
    if chosen:
        if chosen not in SOURCES:
            raise ValueError(f"E2E_CLUSTER={chosen!r} is not a cluster the e2e tests know: use one of "
                             f"{', '.join(SOURCES)} (or leave it unset for the default order)")
        return chosen
    if os.environ.get("TASKHERD_KUBECONFIG") or os.environ.get("KUBECONFIG"):
        return "explicit"
    if kindlib.kind_binary() and kindlib.pulled_image_in_docker():
        return "kind"
    return "local"


def resolve() -> Cluster:
    """The cluster selected_source() names, ready to use; kind is brought up (make kind-cluster)."""
    kubectl, helm = kubectl_path(), helm_path()
    source = selected_source()
    if source == "explicit":
        for var in ("TASKHERD_KUBECONFIG", "KUBECONFIG"):
            if os.environ.get(var):
                log.info("cluster: explicit kubeconfig from %s=%s", var, os.environ[var])
                return Cluster("explicit", os.environ[var], kubectl, helm)
        raise ClusterUnavailable("E2E_CLUSTER=explicit, but neither TASKHERD_KUBECONFIG nor KUBECONFIG is set")
    if source == "kind":
        # Chosen by E2E_CLUSTER: the node image of TASKHERD_KIND_NODE_IMAGE, else the one built here.
        # Chosen by the default order: the kindest/node image found in docker.
        image = None if os.environ.get("E2E_CLUSTER") else kindlib.pulled_image_in_docker()
        if image:  # from now on this process's docker and kind commands are about that cluster
            os.environ["TASKHERD_KIND_NODE_IMAGE"] = image
        log.info("cluster: kind (node image %s)", kindlib.node_image())
        try:
            return Cluster("kind", kindlib.ensure_cluster(image), kubectl, helm)
        except kindlib.KindError as e:
            raise ClusterUnavailable(str(e)) from e
    log.info("cluster: local (%s)", local_kubeconfig())
    return Cluster("local", str(local_kubeconfig()), kubectl, helm)


def wait_for(what: str, probe: Callable[[], Any], timeout: float, interval: float = 1.0,
             progress_every: float = 10.0) -> Any:
    """Call probe() until it returns something truthy; return that. Log progress; raise
    WaitTimeout naming `what` and the last value or exception seen."""
    start = time.monotonic()
    next_log = start + progress_every
    last: Any = None
    while True:
        try:
            last = probe()
            if last:
                return last
        except Exception as e:  # noqa: BLE001 - reported in the timeout message
            last = e
        now = time.monotonic()
        if now - start >= timeout:
            raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what}; last seen: {last!r}")
        if now >= next_log:
            log.info("still waiting for %s (%.0fs): %r", what, now - start, last)
            next_log = now + progress_every
        time.sleep(interval)
