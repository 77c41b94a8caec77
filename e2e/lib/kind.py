"""The `taskherd` kind cluster: bringing it up, and the node-level faults the chaos suite injects.

Two paths, chosen by the node image (the same rule as e2e/kind/lib.sh):

* **built here**: ``taskherd.local/kind-node:<kubernetes version>`` (``make kind-image``), run in a
  docker daemon of the project's own (socket ``$TASKHERD_HOME/kind/docker/docker.sock``);
* **pulled**: ``TASKHERD_KIND_NODE_IMAGE=kindest/node:<tag>``, in the environment's docker.

Creating, loading images and deleting are e2e/kind/up.sh and down.sh (``make kind-cluster``,
``make kind-cluster-down``); this module runs up.sh and adds what tests need:

* :func:`lose_node` / :func:`restore_node`: a node lost without warning (its container killed, as
  in a power cut: no drain, no graceful shutdown, no process in it gets a signal it can handle),
  and brought back;
* :func:`drain` / :func:`uncordon`: ``kubectl drain``, which evicts through the eviction API and so
  honours PodDisruptionBudgets.

Only the standard library is used.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .cluster import Cluster

REPO_ROOT = Path(__file__).resolve().parents[2]
UP_SCRIPT = REPO_ROOT / "e2e" / "kind" / "up.sh"
CLUSTER_NAME = "taskherd"
#: the docker network kind puts its nodes on (e2e/kind/lib.sh: KIND_NETWORK)
NETWORK = "kind"
#: labels kind puts on its node containers
CLUSTER_LABEL = "io.x-k8s.kind.cluster"
ROLE_LABEL = "io.x-k8s.kind.role"


class KindError(RuntimeError):
    """kind or docker failed; the message says what and carries their output."""


def _home() -> Path:
    return Path(os.environ.get("TASKHERD_HOME") or Path.home() / ".cache" / "taskherd")


def _versions() -> dict[str, str]:
    from .cluster import versions

    return versions()


def kind_binary() -> str | None:
    """kind as `make kind-binary` builds it, else one on PATH."""
    built = _home() / "bin" / f"kind-{_versions()['KIND_VERSION']}" / "kind"
    if built.is_file() and os.access(built, os.X_OK):
        return str(built)
    return shutil.which("kind")


def built_image() -> str:
    return f"taskherd.local/kind-node:{_versions()['KUBERNETES_VERSION']}"


def node_image() -> str:
    return os.environ.get("TASKHERD_KIND_NODE_IMAGE") or built_image()


def built_here(image: str) -> bool:
    return image.startswith("taskherd.local/")


def kubeconfig() -> Path:
    return _home() / "kind" / "kubeconfig"


def docker_env(image: str | None = None) -> dict[str, str]:
    """The environment for docker and kind commands: the project's daemon on the built-here path."""
    env = dict(os.environ)
    if built_here(image or node_image()):
        env["DOCKER_HOST"] = f"unix://{_home() / 'kind' / 'docker' / 'docker.sock'}"
    return env


def pulled_image_in_docker() -> str | None:
    """A kindest/node image in the environment's docker, or None (no docker, no daemon, no image):
    with the kind binary, what makes the default resolution pick kind."""
    docker = shutil.which("docker")
    if not docker:
        return None
    try:
        r = subprocess.run(
            [docker, "image", "ls", "kindest/node", "--format", "{{.Repository}}:{{.Tag}}"],
            capture_output=True, text=True, timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    images = [i for i in r.stdout.split() if not i.endswith(":<none>")] if r.returncode == 0 else []
    return images[0] if images else None


def ensure_cluster(image: str | None = None, timeout: float = 3600) -> str:
    """Bring the cluster up with e2e/kind/up.sh (a no-op but for changed images when it is healthy;
    it builds the node image first when that is missing) and return its kubeconfig path."""
    env = dict(os.environ)
    if image:
        env["TASKHERD_KIND_NODE_IMAGE"] = image
    r = subprocess.run(["bash", str(UP_SCRIPT)], env=env, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        tail = "\n".join((r.stderr or r.stdout).splitlines()[-30:])
        raise KindError(f"`make kind-cluster` (e2e/kind/up.sh) failed with exit code {r.returncode}; last lines:\n{tail}")
    return str(kubeconfig())


def _docker(*args: str, timeout: float = 120) -> str:
    r = subprocess.run(["docker", *args], env=docker_env(), capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise KindError(f"`docker {' '.join(args)}` exited {r.returncode}: {(r.stderr or r.stdout).strip()}")
    return r.stdout


def host_address() -> str:
    """This host's IPv4 address on kind's docker network (the gateway of ``kind``): the nodes, and
    through them the pods, reach this host there."""
    configs = _docker("network", "inspect", NETWORK, "-f", "{{range .IPAM.Config}}{{.Gateway}} {{end}}").split()
    ipv4 = [address for address in configs if "." in address]
    if not ipv4:
        raise KindError(f"docker network {NETWORK!r} has no IPv4 gateway (configs: {configs})")
    return ipv4[0]


def nodes(role: str | None = None) -> list[str]:
    """Names of the cluster's node containers (= Kubernetes node names), optionally of one role
    (``control-plane`` or ``worker``), sorted."""
    filters = ["--filter", f"label={CLUSTER_LABEL}={CLUSTER_NAME}"]
    if role:
        filters += ["--filter", f"label={ROLE_LABEL}={role}"]
    return sorted(_docker("ps", "-a", *filters, "--format", "{{.Names}}").split())


def lose_node(name: str) -> None:
    """The node is lost: its container is killed with SIGKILL, so systemd, the kubelet, containerd and
    every pod on it stop at once, with no drain and no termination grace. The API server learns of
    it only when the node's heartbeats stop (node-monitor-grace-period)."""
    _docker("kill", "--signal", "KILL", name)


def restore_node(cluster: Cluster, name: str, timeout: float = 180) -> None:
    """Start a lost node's container again and wait until its kubelet reports Ready *since the
    restart*: the Ready condition the API server still holds for a node lost less than its
    node-monitor-grace-period ago is the dead kubelet's, and a node taken for back on it has no
    container runtime yet (loading an image into it fails). docker may give the node another address
    (kind's entrypoint rewrites the node's own files for that): up.sh then routes the node's pod
    range from this host to the new one."""
    restarted = datetime.now(timezone.utc).replace(microsecond=0)
    _docker("start", name)
    cluster.wait(f"node {name} Ready again (a heartbeat since {restarted:%H:%M:%S})",
                 lambda: node_ready(cluster, name, since=restarted), timeout, 2)
    ensure_cluster()


def node_ready(cluster: Cluster, name: str, since: datetime | None = None) -> bool:
    """The node's Ready condition is True (and, with `since`, was last reported at or after it)."""
    node = cluster.kubectl_json("get", "node", name)
    for condition in node["status"].get("conditions", []):
        if condition["type"] == "Ready" and condition["status"] == "True":
            heartbeat = datetime.fromisoformat(condition["lastHeartbeatTime"].replace("Z", "+00:00"))
            return since is None or heartbeat >= since
    return False


def drain(cluster: Cluster, name: str, pod_selector: str, timeout: float = 300) -> str:
    """`kubectl drain` of the pods matching `pod_selector`: cordon the node, then evict them through
    the eviction API, which refuses an eviction that would break a PodDisruptionBudget (kubectl
    retries it every 5 s until allowed). The selector keeps a test from evicting what it did not
    create (other tests' pods, the in-cluster services, whose volumes are bound to their node).
    Returns kubectl's output, which names each eviction a budget held back."""
    r = cluster.kubectl("drain", name, f"--pod-selector={pod_selector}", "--ignore-daemonsets",
                        "--delete-emptydir-data", f"--timeout={int(timeout)}s", timeout=timeout + 30)
    return r.stdout + r.stderr


def uncordon(cluster: Cluster, name: str) -> None:
    cluster.kubectl("uncordon", name)
