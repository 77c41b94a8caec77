"""Reaching the host's loopback services from the pods of the local cluster or kind.

Pods cannot reach 127.0.0.1 of the host; they reach the host's address on the local cluster's pod
bridge (``taskherd0``), or on kind's docker network (the nodes' gateway). :class:`Forwarder` listens
there on a free port and relays each connection to a loopback port, one thread pair per connection,
for as long as its owner runs.
"""
from __future__ import annotations

import re
import socket
import subprocess
import threading
from typing import Any

#: the local cluster's pod bridge (e2e/cluster/up.sh)
BRIDGE = "taskherd0"


def pod_gateway_address(cluster: Any = None) -> str:
    """The host's address as the pods of `cluster` reach it: kind's network gateway for a kind
    cluster, else the local cluster's pod bridge; raises when there is neither."""
    if cluster is not None and cluster.source == "kind":
        from e2e.lib import kind

        return kind.host_address()
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", BRIDGE], capture_output=True, text=True).stdout
    match = re.search(r"inet (\d+\.\d+\.\d+\.\d+)/", out)
    if not match:
        raise RuntimeError(f"no {BRIDGE} bridge: this needs the local cluster (`make cluster`) or kind")
    return match.group(1)


class Forwarder:
    """TCP forwarder listen_host:<free port> -> target."""

    def __init__(self, *, listen_host: str, target: tuple[str, int]) -> None:
        self.target = target
        self.server = socket.create_server((listen_host, 0))
        self.port = self.server.getsockname()[1]
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.server.close()
        for s in self.sockets:
            s.close()
