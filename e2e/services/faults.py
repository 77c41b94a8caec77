"""Faults on the services themselves, for tests and the chaos suite: a server killed like a crash."""
from __future__ import annotations

import time
from typing import Callable

from e2e.lib import cluster as clusters

from .config import NAMESPACE


def _restarts_and_ready(cluster: clusters.Cluster, pod: str, namespace: str) -> tuple[int, bool]:
    status = cluster.kubectl_json("get", "pod", pod, "-n", namespace).get("status", {})
    [container] = status.get("containerStatuses") or [{}]
    return container.get("restartCount", 0), bool(container.get("ready"))


#: The kubelet delays each restart of a container that keeps dying (10 s, doubled per crash, at
#: most 5 minutes; forgotten after 10 minutes of running): the crash tests and chaos runs that
#: kill the same server again and again meet the whole back-off, plus the server's own start.
RESTART_PATIENCE_SECONDS = 300 + 120


def crash_container(cluster: clusters.Cluster, component: str, *, pod_index: int = 0, namespace: str = NAMESPACE,
                    timeout: float = RESTART_PATIENCE_SECONDS, log: Callable[[str], None] = print) -> float:
    """SIGKILL every process of the server in `<component>-<pod_index>` and wait until the kubelet
    has restarted the container and it is Ready again. Returns the seconds that took.

    `kill -KILL -1` from `kubectl exec` reaches every process of the container's user except PID 1
    (tini) and itself: the server dies without a chance to flush anything, tini exits 137, the
    container restarts in the same pod (same volume, same address, same node name).
    """
    pod = f"{component}-{pod_index}"
    restarts, _ = _restarts_and_ready(cluster, pod, namespace)
    started = time.monotonic()
    # The exec session may itself be cut when the container dies: its exit status tells nothing.
    cluster.kubectl("exec", "-n", namespace, pod, "-c", component, "--", "kill", "-KILL", "-1",
                    check=False, timeout=60)
    clusters.wait_for(f"{pod}'s container to restart and be Ready",
                      lambda: (lambda r: r[0] > restarts and r[1])(_restarts_and_ready(cluster, pod, namespace)),
                      timeout=timeout, interval=1,
                      ignoring=(clusters.CommandFailed,))
    seconds = time.monotonic() - started
    log(f"{pod}: server SIGKILLed, container restarted and Ready in {seconds:.1f}s")
    return seconds
