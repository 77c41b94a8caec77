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

Only the standard library is used. Waits are the bounded, logged ones of e2e/lib/waiting.py.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

from . import kind as kindlib
from .envfile import read_env_file
from .waiting import WaitTimeout, wait_for

log = logging.getLogger("taskherd.e2e.cluster")

REPO_ROOT = Path(__file__).resolve().parents[2]
VERSIONS_FILE = REPO_ROOT / "e2e" / "cluster" / "versions.env"
KIND_CLUSTER_NAME = kindlib.CLUSTER_NAME
#: the values E2E_CLUSTER accepts
SOURCES = ("explicit", "kind", "local")
T = TypeVar("T")


class ClusterUnavailable(RuntimeError):
    """The selected cluster cannot be reached; the message says why, verbatim."""


class CommandFailed(RuntimeError):
    """kubectl or helm failed; the message carries the command and its stderr."""

    def __init__(self, message: str, result: subprocess.CompletedProcess):
        super().__init__(message)
        self.result = result


class ImagesMissing(RuntimeError):
    """Images a test needs are not in the cluster's container runtime; the message names them per node."""


def versions() -> dict[str, str]:
    return read_env_file(VERSIONS_FILE)


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


def crictl_path() -> str:
    return str(taskherd_home() / "bin" / f"crictl-{versions()['CRICTL_VERSION']}" / "crictl")


def local_containerd_socket() -> Path:
    """The containerd of `make cluster` (e2e/cluster/lib.sh: CONTAINERD_SOCK)."""
    return taskherd_home() / "cluster" / "containerd" / "containerd.sock"


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

    def wait(self, what: str, observe: Callable[[], T], timeout: float, interval: float = 1.0, **kw: Any) -> T:
        """wait_for on the cluster's state: a kubectl call that fails (the object is not created yet,
        the API server is busy) counts as "not yet", and is what the timeout reports if it was last."""
        return wait_for(what, observe, timeout, interval, ignoring=(CommandFailed,), **kw)

    def create_namespace(self, name: str, labels: dict[str, str], annotations: dict[str, str]) -> str:
        """Creates the namespace and returns its name once its default ServiceAccount exists (the
        API creates it asynchronously, and no pod is admitted before it does)."""
        self.apply(json.dumps({"apiVersion": "v1", "kind": "Namespace",
                               "metadata": {"name": name, "labels": labels, "annotations": annotations}}))
        self.wait(f"the default ServiceAccount in namespace {name}",
                  lambda: self.kubectl_json("-n", name, "get", "sa", "default")["metadata"]["name"], 60, 0.5)
        return name

    def delete_namespace(self, name: str) -> None:
        self.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)

    def describe_namespace(self, namespace: str, *, log_lines: int = 80) -> str:
        """What a reader of a failed test needs from a namespace: its pods, its events in order and
        each container's last log lines (and the previous run's, for a restarted container)."""
        parts = []
        for args in (("get", "pods", "-o", "wide"), ("get", "events", "--sort-by=.lastTimestamp")):
            r = self.kubectl("-n", namespace, *args, check=False)
            parts.append(f"$ kubectl -n {namespace} {' '.join(args)}\n{(r.stdout + r.stderr).rstrip()}")
        r = self.kubectl("-n", namespace, "get", "pods", "-o", "json", check=False)
        pods = json.loads(r.stdout)["items"] if r.returncode == 0 else []
        for pod in pods:
            name = pod["metadata"]["name"]
            for status in pod["status"].get("containerStatuses", []):
                runs = [("--previous",)] if status.get("restartCount") else []
                for extra in runs + [()]:
                    logs = self.kubectl("-n", namespace, "logs", name, "-c", status["name"], f"--tail={log_lines}",
                                        *extra, check=False)
                    label = f"$ kubectl -n {namespace} logs {name} -c {status['name']} {' '.join(extra)}".rstrip()
                    parts.append(f"{label}\n{(logs.stdout or logs.stderr).rstrip()}")
        return "\n\n".join(parts)

    def oom_kills(self, namespace: str, pod: str) -> int | None:
        """The kernel's OOM-kill counter of the pod's memory cgroup (v2 memory.events, v1
        memory.oom_control); None when neither answers. With prefork on cgroup v1 only the pool
        child dies and Kubernetes records no OOMKilled, so this counter is the evidence."""
        r = self.kubectl("exec", "-n", namespace, pod, "--", "sh", "-c",
                         "cat /sys/fs/cgroup/memory.events 2>/dev/null || cat /sys/fs/cgroup/memory/memory.oom_control",
                         check=False, timeout=30)
        for line in r.stdout.splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
        return None

    def node_names(self) -> list[str]:
        return [n["metadata"]["name"] for n in self.kubectl_json("get", "nodes")["items"]]

    def ready_nodes(self) -> list[str]:
        nodes = self.kubectl_json("get", "nodes")["items"]
        return [n["metadata"]["name"] for n in nodes
                if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))]

    def check_reachable(self, timeout: float = 0) -> None:
        """Returns once the API server answers /readyz with ok and a node is Ready, waiting up to
        `timeout` seconds; else raises ClusterUnavailable with the exact error."""
        if not Path(self.kubectl_bin).is_file():
            raise ClusterUnavailable(
                f"kubectl not found at {self.kubectl_bin}: run `make cluster-binaries` (or `make cluster`)"
            )
        if not Path(self.kubeconfig).is_file():
            raise ClusterUnavailable(f"kubeconfig {self.kubeconfig} ({self.source} cluster) does not exist"
                                     + _make_cluster_hint(self))

        def readyz() -> str:
            r = self.kubectl("get", "--raw", "/readyz", check=False, timeout=30)
            return (r.stdout if r.returncode == 0 else r.stderr or r.stdout).strip()

        try:
            wait_for("the API server to answer /readyz with ok", readyz, timeout, 1, equals="ok")
            self.wait("a Ready node", self.ready_nodes, timeout, 1)
        except WaitTimeout as e:
            raise ClusterUnavailable(f"{self.source} cluster ({self.kubeconfig}) is not ready: {e}"
                                     + _make_cluster_hint(self)) from None

    # --- images, as the container runtime sees them -------------------------------------------

    def runtime_images(self) -> dict[str, set[str]]:
        """The image names each node's container runtime holds, asked through the CRI (`crictl
        images`): the kubelet's own view, current at once. The nodes' `status.images` lag behind it
        (the kubelet reports them on its next status update) and list at most 50 images."""
        if self.source == "local":
            # one node, on this host: its containerd is the one of e2e/cluster/lib.sh
            command = [crictl_path(), "--runtime-endpoint", f"unix://{local_containerd_socket()}"]
            return {node: _crictl_image_names(command) for node in self.node_names()}
        if self.source == "kind":
            # kind's node containers are named after their nodes and ship crictl
            return {node: _crictl_image_names(["docker", "exec", node, "crictl"], env=kindlib.docker_env())
                    for node in self.node_names()}
        raise ClusterUnavailable(f"the runtime of the {self.source} cluster cannot be asked from here")

    def require_images(self, images: Sequence[str], timeout: float = 120) -> None:
        """Raises ImagesMissing unless every node holds every one of `images`. Asks the CRI where it
        can (local and kind clusters), at once; on an explicit cluster, where only the API is
        reachable, waits up to `timeout` seconds for the nodes' `status.images` to list them."""
        if self.source in ("local", "kind"):
            missing = missing_images(images, self.runtime_images())
            if missing:
                listed = "; ".join(f"{node}: {names}" for node, names in sorted(missing.items()))
                raise ImagesMissing(f"not in the container runtime (crictl images) of the {self.source} cluster: "
                                    f"{listed}: run `make images`")
            return
        try:
            self.wait(f"images {list(images)} in the nodes' status.images",
                      lambda: missing_images(images, self.node_status_images()), timeout, 2, equals={})
        except WaitTimeout as e:
            raise ImagesMissing(f"{e}: load them into the cluster's nodes") from None

    def node_status_images(self) -> dict[str, set[str]]:
        """The image names the kubelets last reported in their nodes' status (late, and at most 50)."""
        return {n["metadata"]["name"]: {name for image in n["status"].get("images") or []
                                        for name in image.get("names") or []}
                for n in self.kubectl_json("get", "nodes")["items"]}


def _crictl_image_names(command: list[str], env: dict[str, str] | None = None) -> set[str]:
    r = subprocess.run([*command, "images", "-o", "json"], capture_output=True, text=True, timeout=60, env=env)
    if r.returncode != 0:
        raise ClusterUnavailable(f"`{' '.join(command)} images` exited {r.returncode}: "
                                 f"{(r.stderr or r.stdout).strip()}")
    return {tag for image in json.loads(r.stdout).get("images") or [] for tag in image.get("repoTags") or []}


def missing_images(wanted: Sequence[str], held: dict[str, set[str]]) -> dict[str, list[str]]:
    """Per node, the `wanted` images it does not hold; a short name matches its registry-qualified
    form (`worker:dev` is `docker.io/library/worker:dev`)."""
    def has(names: set[str], image: str) -> bool:
        return image in names or any(name.endswith("/" + image) for name in names)

    missing = {node: [i for i in wanted if not has(names, i)] for node, names in held.items()}
    return {node: images for node, images in missing.items() if images} if held else {"(no node)": list(wanted)}


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
    try:
        r = subprocess.run(list(cmd), input=input, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        # No answer is a failed call (an API server restarting under load, say), which waits that
        # ignore CommandFailed count as "not yet"; timeout(1)'s exit status.
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        raise CommandFailed(f"`{' '.join(cmd)}` gave no answer in {timeout:g} s",
                            subprocess.CompletedProcess(list(cmd), 124, out, f"no answer in {timeout:g} s")) from None
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
    explicit = os.environ.get("TASKHERD_KUBECONFIG") or os.environ.get("KUBECONFIG")
    if explicit:
        return own_cluster_of(explicit) or "explicit"
    if kindlib.kind_binary() and kindlib.pulled_image_in_docker():
        return "kind"
    return "local"


def own_cluster_of(kubeconfig: str) -> str | None:
    """"local" or "kind" when a kubeconfig is the one this project wrote for that cluster (a reader
    who ran `eval "$(make cluster-env)"` has KUBECONFIG set, and still means the local cluster:
    its images are imported, not pushed, and node faults are possible), else None."""
    given = os.path.realpath(kubeconfig)
    for source, path in (("local", local_kubeconfig()), ("kind", kindlib.kubeconfig())):
        if given == os.path.realpath(path):
            return source
    return None


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
