"""Reaching into a node, for the faults that Kubernetes' API cannot cause: a signal to a container's
main process, iptables in a pod's network namespace, a kubelet restart.

A container's main process is PID 1 of its PID namespace, and PID 1 ignores SIGKILL and SIGSTOP
sent from inside that namespace (`kubectl exec … kill -9 1` does nothing): the signal has to come
from the node. So the node runs the command:

- the local cluster (`make cluster`): the node is this host; its containerd is the cluster's own
  (e2e/cluster/lib.sh), asked with the pinned crictl;
- kind: each node is a docker container with crictl, nsenter and iptables: `docker exec <node> …`;
- any other cluster: no access; a fault that needs it fails saying so (spec requirement
  `node-access`).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from e2e.lib import cluster as clusters
from e2e.lib.waiting import wait_for


class NodeAccessError(RuntimeError):
    """The node could not be reached or refused the command; the message has its output."""


@dataclass(frozen=True)
class ContainerProcess:
    node: str
    pid: int  #: the main process's PID as the node sees it
    container_id: str


class NodeAccess:
    def __init__(self, cluster: clusters.Cluster):
        if cluster.source not in ("local", "kind"):
            raise NodeAccessError(f"the {cluster.source} cluster ({cluster.kubeconfig}) gives no access to its "
                                  "nodes: faults that signal a container's main process, partition a pod or restart "
                                  "a kubelet need the local cluster or kind")
        self.cluster = cluster

    # --- running a command on a node -----------------------------------------------------------

    def run(self, node: str, argv: Sequence[str], *, check: bool = True, timeout: float = 60) -> str:
        if self.cluster.source == "local":
            command = list(argv)
            env = None
        else:
            from e2e.lib import kind

            command, env = ["docker", "exec", node, *argv], kind.docker_env()
        r = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
        if check and r.returncode != 0:
            raise NodeAccessError(f"on node {node}: `{' '.join(argv)}` exited {r.returncode}: "
                                  f"{(r.stderr or r.stdout).strip()}")
        return r.stdout

    def crictl(self) -> list[str]:
        if self.cluster.source == "local":
            return [clusters.crictl_path(), "--runtime-endpoint", f"unix://{clusters.local_containerd_socket()}"]
        return ["crictl"]

    # --- containers ------------------------------------------------------------------------------

    def main_process(self, namespace: str, pod: str, container: str | None = None) -> ContainerProcess:
        """The node and node-side PID of the container's main process (the first container by default)."""
        obj = self.cluster.kubectl_json("-n", namespace, "get", "pod", pod)
        statuses = obj.get("status", {}).get("containerStatuses") or []
        status = next((s for s in statuses if container in (None, s["name"])), None)
        if status is None or not status.get("containerID") or "running" not in (status.get("state") or {}):
            raise NodeAccessError(f"pod {namespace}/{pod}: container {container or '(first)'} is not running: "
                                  f"{json.dumps(statuses)[:400]}")
        node = obj["spec"]["nodeName"]
        container_id = status["containerID"].split("://", 1)[-1]
        info = json.loads(self.run(node, [*self.crictl(), "inspect", container_id]))
        pid = int(info["info"]["pid"])
        if pid <= 0:
            raise NodeAccessError(f"pod {namespace}/{pod}: crictl reports no process for {container_id}")
        return ContainerProcess(node, pid, container_id)

    def signal(self, process: ContainerProcess, signum: signal.Signals) -> None:
        self.run(process.node, ["kill", f"-{signum.name.removeprefix('SIG')}", str(process.pid)])

    def in_network_namespace(self, process: ContainerProcess, argv: Sequence[str], *, check: bool = True) -> str:
        """Runs `argv` (iptables, say) on the node inside the pod's network namespace."""
        return self.run(process.node, ["nsenter", "-t", str(process.pid), "-n", *argv], check=check)

    # --- the kubelet -------------------------------------------------------------------------------

    def restart_kubelet(self, node: str, timeout: float = 120) -> float:
        """Stops the node's kubelet (SIGTERM, as `systemctl restart` does) and starts it again;
        returns the seconds until the node reports Ready with a fresh heartbeat."""
        started = time.monotonic()
        before = self._node_heartbeat(node)
        if self.cluster.source == "kind":
            self.run(node, ["systemctl", "restart", "kubelet"])
        else:
            _restart_local_kubelet()
        wait_for(f"node {node} Ready with a heartbeat from the new kubelet",
                 lambda: self._node_heartbeat(node), timeout, 1,
                 until=lambda beat: beat is not None and beat != before)
        return time.monotonic() - started

    def _node_heartbeat(self, node: str) -> str | None:
        """The Ready condition's last heartbeat time when the node is Ready, else None."""
        conditions = self.cluster.kubectl_json("get", "node", node)["status"].get("conditions", [])
        ready = next((c for c in conditions if c["type"] == "Ready"), {})
        return ready.get("lastHeartbeatTime") if ready.get("status") == "True" else None


def _restart_local_kubelet() -> None:
    """The local cluster's kubelet is a host process recorded in a pid file ("PID EXE",
    e2e/cluster/lib.sh start_proc): it is stopped by that PID and started again with the same
    command line, environment and working directory, logging to the same file, and its new PID is
    recorded the same way, so `make cluster` still finds the cluster healthy."""
    home = clusters.taskherd_home() / "cluster"
    pid_file, log_file = home / "run" / "kubelet.pid", home / "logs" / "kubelet.log"
    pid_text, _, exe = pid_file.read_text().strip().partition(" ")
    pid = int(pid_text)
    proc = Path(f"/proc/{pid}")
    if not proc.exists() or os.path.realpath(proc / "exe") != os.path.realpath(exe):
        raise NodeAccessError(f"{pid_file} names PID {pid} ({exe}), which is not a running kubelet")
    argv = [a.decode() for a in (proc / "cmdline").read_bytes().split(b"\0") if a]
    environ = dict(item.decode().split("=", 1) for item in (proc / "environ").read_bytes().split(b"\0") if b"=" in item)
    cwd = os.readlink(proc / "cwd")
    os.kill(pid, signal.SIGTERM)
    wait_for(f"the kubelet (PID {pid}) to exit", lambda: not proc.exists() or _zombie(proc), 30, 0.2)
    with open(log_file, "ab") as log, open(os.devnull, "rb") as null:
        new = subprocess.Popen(argv, stdin=null, stdout=log, stderr=subprocess.STDOUT, env=environ, cwd=cwd,
                               start_new_session=True)
    pid_file.write_text(f"{new.pid} {exe}\n")


def _zombie(proc: Path) -> bool:
    try:
        return (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
