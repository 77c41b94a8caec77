"""This host's way to the in-cluster services: local listeners on 127.0.0.1, one per Service port,
each connection tunnelled to a Ready pod behind the Service through the API server's port-forward
(`pods/portforward`, the websocket channel protocol), in a background thread of this process.

It needs nothing but the API server: no route to pod or Service addresses, no NodePort, no
forwarder on a bridge address, so it works the same on the local cluster, on kind and on a remote
cluster. Unlike `kubectl port-forward`, which gives up every connection as soon as one of them is
reset (a broker closing a client's socket is enough: kubernetes/kubernetes#111825), each connection
here has its own stream: one ending touches no other. A connection opened while no pod is Ready
(a broker restarting) is closed at once and the client reconnects; a new connection goes to
whichever pod is Ready then. Nothing outlives the process: there is no child process.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from typing import Iterator, Mapping

from kubernetes_asyncio import client, config
from kubernetes_asyncio.stream import WsApiClient

from e2e.lib import cluster as clusters

from .config import NAMESPACE, PORTS

log = logging.getLogger("taskherd.e2e.services")
DATA_CHANNEL, ERROR_CHANNEL = 0, 1
#: the kubelet starts each channel with the forwarded port number (2 bytes, little-endian)
PORT_PREFIX = 2
CHUNK = 64 * 1024


class ForwardError(RuntimeError):
    """The tunnel could not start (the API server refused, a Service has no selector, ...)."""


class NoReadyPod(ForwardError):
    """No pod behind the Service is Ready: a connection made now is closed at once."""


def ready_pod(pods: list[dict]) -> str | None:
    """The Ready, not terminating pod to connect to: the first by name, so that every connection
    goes to the same one while it lasts (a RabbitMQ cluster's client sees one node)."""
    ready = sorted(p["metadata"]["name"] for p in pods
                   if not p["metadata"].get("deletion_timestamp")
                   and any(c["type"] == "Ready" and c["status"] == "True"
                           for c in (p.get("status") or {}).get("conditions") or []))
    return ready[0] if ready else None


class Tunnel:
    """Listeners for some Services' ports; `open(service, ports)` returns their local ports."""

    def __init__(self, cluster: clusters.Cluster, *, namespace: str = NAMESPACE):
        self.cluster, self.namespace = cluster, namespace
        self.connections = 0
        self.failures: list[str] = []  #: why connections were refused or cut, latest last
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="services tunnel", daemon=True)
        self._servers: list[asyncio.AbstractServer] = []
        self._api: client.ApiClient | None = None
        self._ws_api: WsApiClient | None = None
        self._thread.start()
        self._call(self._connect_api(), timeout=60)

    def _call(self, coroutine, timeout: float):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    async def _connect_api(self) -> None:
        configuration = client.Configuration()
        await config.load_kube_config(config_file=self.cluster.kubeconfig, client_configuration=configuration)
        self._api = client.ApiClient(configuration)
        self._ws_api = WsApiClient(configuration=configuration)

    def open(self, service: str, ports: Mapping[str, int], timeout: float = 60) -> dict[str, int]:
        """Listen on 127.0.0.1 for each of the Service's ports; returns port name -> local port."""
        return self._call(self._open(service, dict(ports)), timeout)

    async def _open(self, service: str, ports: dict[str, int]) -> dict[str, int]:
        svc = await client.CoreV1Api(self._api).read_namespaced_service(service, self.namespace)
        if not svc.spec.selector:
            raise ForwardError(f"Service {self.namespace}/{service} has no selector: nothing to forward to")
        selector = ",".join(f"{k}={v}" for k, v in svc.spec.selector.items())
        local = {}
        for name, port in ports.items():
            server = await asyncio.start_server(
                lambda r, w, p=port: self._serve(r, w, service, selector, p), "127.0.0.1", 0)
            self._servers.append(server)
            local[name] = server.sockets[0].getsockname()[1]
        return local

    async def _pod_for(self, service: str, selector: str) -> str:
        pods = await client.CoreV1Api(self._api).list_namespaced_pod(self.namespace, label_selector=selector)
        pod = ready_pod([p.to_dict() for p in pods.items])
        if pod is None:
            raise NoReadyPod(f"no Ready pod behind Service {self.namespace}/{service}")
        return pod

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, service: str,
                     selector: str, port: int) -> None:
        self.connections += 1
        try:
            pod = await self._pod_for(service, selector)
            stream = await client.CoreV1Api(self._ws_api).connect_get_namespaced_pod_portforward(
                pod, self.namespace, ports=port, _preload_content=False)
            async with stream as ws:
                await self._pump(reader, writer, ws, f"{pod}:{port}")
        except Exception as exc:  # noqa: BLE001 - one connection's end; the listener goes on
            self.failures = (self.failures + [f"{service}:{port}: {type(exc).__name__}: {exc}"])[-20:]
            log.debug("tunnel to %s:%d ended: %s", service, port, exc)
        finally:
            writer.close()

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ws, target: str) -> None:
        async def upstream() -> None:
            while data := await reader.read(CHUNK):
                await ws.send_bytes(bytes([DATA_CHANNEL]) + data)

        async def downstream() -> None:
            skip = {DATA_CHANNEL: PORT_PREFIX, ERROR_CHANNEL: PORT_PREFIX}
            error = b""
            async for message in ws:
                if not isinstance(message.data, bytes) or not message.data:
                    continue
                channel, payload = message.data[0], message.data[1:]
                if skip.get(channel):
                    cut = min(skip[channel], len(payload))
                    skip[channel] -= cut
                    payload = payload[cut:]
                if not payload:
                    continue
                if channel == DATA_CHANNEL:
                    writer.write(payload)
                    await writer.drain()
                elif channel == ERROR_CHANNEL:
                    error += payload
            if error:
                raise ForwardError(f"{target}: {error.decode(errors='replace').strip()}")

        tasks = [asyncio.ensure_future(upstream()), asyncio.ensure_future(downstream())]
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        for task in done:
            task.result()

    def close(self) -> None:
        async def shutdown() -> None:
            for server in self._servers:
                server.close()
            for api in (self._api, self._ws_api):
                if api is not None:
                    await api.close()
        try:
            self._call(shutdown(), timeout=30)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)


@contextlib.contextmanager
def port_forwards(cluster: clusters.Cluster, components: tuple[str, ...], *, namespace: str = NAMESPACE,
                  timeout: float = 60) -> Iterator[dict[str, dict[str, int]]]:
    """Local ports for every port of each component's Service; yields component -> {port name: local port}."""
    tunnel = Tunnel(cluster, namespace=namespace)
    try:
        yield {c: tunnel.open(c, PORTS[c], timeout) for c in components}
    finally:
        tunnel.close()


def wait_answering(what: str, probe, timeout: float) -> None:
    """Until a protocol-level probe through a tunnel succeeds: a listener accepts a connection
    before it knows whether a pod will, so a listening port proves nothing."""
    clusters.wait_for(what, lambda: probe() or True, timeout=timeout, interval=0.5,
                      ignoring=(Exception,))
