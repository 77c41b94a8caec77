"""This host's way to the in-cluster services: `kubectl port-forward`, one supervised process per
Service, on 127.0.0.1 only.

It needs nothing but the API server: no route to pod or Service addresses, no NodePort, no
forwarder on a bridge address. So it works the same on the local cluster, on kind and on a remote
cluster. A port-forward ends when the pod behind it goes (a restarted broker, a killed node): the
supervisor starts it again on the same local port, so a client that reconnects (kombu, psycopg,
redis-py) carries on. The processes die with the Python process that started them (PR_SET_PDEATHSIG),
so no forwarder outlives its run.
"""
from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import re
import signal
import subprocess
import threading
from typing import Callable, Iterator, Mapping

from e2e.lib import cluster as clusters

from .config import NAMESPACE, PORTS

log = logging.getLogger("taskherd.e2e.services")
#: set in each kubectl port-forward's environment to the PID of the Python process that started it,
#: so a test can prove none outlived its run
OWNER_ENV = "TASKHERD_PORT_FORWARD_OF"
FORWARDING = re.compile(r"^Forwarding from 127\.0\.0\.1:(\d+) -> (\d+)")
_PR_SET_PDEATHSIG = 1


class ForwardError(RuntimeError):
    """A port-forward did not come up; the message has kubectl's own words."""


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: SIGTERM when the thread that started it ends.
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class PortForward:
    """`kubectl port-forward svc/<service>` for some of its ports, kept running until stop()."""

    def __init__(self, cluster: clusters.Cluster, service: str, remote_ports: Mapping[str, int], *,
                 namespace: str = NAMESPACE, restart_delay: float = 1.0):
        self.cluster, self.service, self.namespace = cluster, service, namespace
        self.remote_ports = dict(remote_ports)
        self.restart_delay = restart_delay
        #: port name -> local port, fixed by the first start and reused by every restart
        self.local_ports: dict[str, int] = {}
        self.restarts = 0
        self._output: list[str] = []
        self._up = threading.Event()
        self._stopping = threading.Event()
        self._proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None

    def _command(self) -> list[str]:
        by_remote = {port: self.local_ports.get(name, 0) for name, port in self.remote_ports.items()}
        specs = [f"{local or ''}:{remote}" for remote, local in by_remote.items()]
        return [self.cluster.kubectl_bin, "--kubeconfig", self.cluster.kubeconfig, "port-forward",
                "--address", "127.0.0.1", "-n", self.namespace, f"svc/{self.service}", *specs]

    def start(self, timeout: float = 60) -> dict[str, int]:
        """Start and wait until kubectl listens on every port; returns port name -> local port."""
        self._thread = threading.Thread(target=self._supervise, name=f"port-forward {self.service}", daemon=True)
        self._thread.start()
        if not self._up.wait(timeout):
            self.stop()
            raise ForwardError(f"kubectl port-forward svc/{self.service} -n {self.namespace} did not listen "
                               f"within {timeout:.0f}s; it said: {' | '.join(self._output[-5:]) or 'nothing'}")
        return dict(self.local_ports)

    def _supervise(self) -> None:
        while not self._stopping.is_set():
            self._proc = subprocess.Popen(self._command(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, text=True,
                                          env={**self.cluster.env(), OWNER_ENV: str(os.getpid())},
                                          preexec_fn=_die_with_parent)
            remote_to_name = {str(port): name for name, port in self.remote_ports.items()}
            seen: set[str] = set()
            for line in self._proc.stdout:
                line = line.strip()
                self._output = (self._output + [line])[-20:]
                match = FORWARDING.match(line)
                if match and match.group(2) in remote_to_name:
                    name = remote_to_name[match.group(2)]
                    self.local_ports[name] = int(match.group(1))
                    seen.add(name)
                    if seen == set(self.remote_ports):
                        self._up.set()
            self._proc.wait()
            if self._stopping.is_set():
                break
            self.restarts += 1
            log.info("port-forward svc/%s exited (%s); starting it again on %s", self.service,
                     self._output[-1] if self._output else self._proc.returncode, self.local_ports)
            self._stopping.wait(self.restart_delay)

    def stop(self) -> None:
        self._stopping.set()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        if self._thread is not None:
            self._thread.join(15)


@contextlib.contextmanager
def port_forwards(cluster: clusters.Cluster, components: tuple[str, ...], *, namespace: str = NAMESPACE,
                  timeout: float = 60) -> Iterator[dict[str, dict[str, int]]]:
    """Forwards of every port of each component's Service; yields component -> {port name: local port}."""
    forwards = [PortForward(cluster, c, PORTS[c], namespace=namespace) for c in components]
    try:
        local = {}
        for forward in forwards:
            local[forward.service] = forward.start(timeout)
        yield local
    finally:
        for forward in forwards:
            forward.stop()


def forwards_started_by(pid: int) -> list[int]:
    """PIDs of the kubectl port-forwards process `pid` started that still run."""
    marker = f"{OWNER_ENV}={pid}".encode()
    found = []
    for proc in os.listdir("/proc"):
        if proc.isdigit():
            try:
                with open(f"/proc/{proc}/environ", "rb") as f:
                    if marker in f.read().split(b"\0"):
                        found.append(int(proc))
            except OSError:
                continue
    return found


def wait_answering(what: str, probe: Callable[[], object], timeout: float) -> None:
    """Until a protocol-level probe through a forward succeeds: kubectl accepts a local connection
    before it knows whether the pod will, so a listening port proves nothing."""
    clusters.wait_for(what, lambda: probe() or True, timeout=timeout, interval=0.5)
