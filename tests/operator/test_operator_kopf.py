"""The kopf wiring (handlers.py -> scheduler -> poll -> API calls) with kopf's own test runner
(`kopf.testing.KopfRunner`) against a small mock API server, and the real Redis for the queue.

Checks what the real API server would need: the scale goes through the `deployments/scale`
subresource and the status through `workerpools/status`, both as JSON merge patches, and no
finalizer or annotation is written to the WorkerPool itself.
"""
from __future__ import annotations

import asyncio
import base64
import json
import threading
import time

import redis
from aiohttp import web
from kopf.testing import KopfRunner

NS = "ns"


class MockApi:
    def __init__(self, redis_url: str, queue: str):
        self.requests: list[tuple[str, str, str, object]] = []
        self.closing = False
        self.replicas = 0
        self.pool = {"apiVersion": "taskherd.io/v1alpha1", "kind": "WorkerPool",
                     "metadata": {"name": "pool", "namespace": NS, "uid": "u1", "resourceVersion": "1",
                                  "generation": 1},
                     "spec": {"scaleTargetRef": {"name": "workers"}, "minReplicas": 0, "maxReplicas": 10,
                              "targetDepthPerWorker": 5, "pollIntervalSeconds": 1,
                              "broker": {"type": "redis", "secretRef": {"name": "broker"}, "queues": [queue]}}}
        self.secret = {"kind": "Secret", "metadata": {"name": "broker", "namespace": NS},
                       "data": {"url": base64.b64encode(redis_url.encode()).decode()}}
        self.app = web.Application()
        self.app.router.add_route("*", "/{tail:.*}", self.handle)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path, method = request.path, request.method
        body = await request.json() if request.can_read_body else None
        self.requests.append((method, path, request.headers.get("Content-Type", ""), body))
        group = f"/apis/taskherd.io/v1alpha1/namespaces/{NS}/workerpools"
        if path == "/api":
            return web.json_response({"kind": "APIVersions", "versions": ["v1"]})
        if path == "/api/v1":
            return web.json_response({"kind": "APIResourceList", "groupVersion": "v1", "resources": [
                {"name": n, "singularName": n[:-1], "namespaced": True, "kind": k, "verbs": ["create", "get", "list"]}
                for n, k in (("events", "Event"), ("pods", "Pod"), ("secrets", "Secret"))] + [
                {"name": "namespaces", "singularName": "namespace", "namespaced": False, "kind": "Namespace",
                 "verbs": ["get", "list", "watch"]}]})  # kopf waits for this resource to be discovered
        if path == "/apis":
            return web.json_response({"kind": "APIGroupList", "groups": [
                {"name": "taskherd.io", "versions": [{"groupVersion": "taskherd.io/v1alpha1", "version": "v1alpha1"}],
                 "preferredVersion": {"groupVersion": "taskherd.io/v1alpha1", "version": "v1alpha1"}}]})
        if path == "/apis/apps/v1":  # discovery of the scale target's kind and its /scale
            return web.json_response({"kind": "APIResourceList", "groupVersion": "apps/v1", "resources": [
                {"name": "deployments", "singularName": "deployment", "namespaced": True, "kind": "Deployment",
                 "verbs": ["get", "list", "patch"]},
                {"name": "deployments/scale", "singularName": "", "namespaced": True, "kind": "Scale",
                 "group": "autoscaling", "version": "v1", "verbs": ["get", "patch", "update"]}]})
        if path == "/apis/taskherd.io/v1alpha1":
            return web.json_response({"kind": "APIResourceList", "groupVersion": "taskherd.io/v1alpha1", "resources": [
                {"name": "workerpools", "singularName": "workerpool", "namespaced": True, "kind": "WorkerPool",
                 "verbs": ["get", "list", "watch", "patch"], "shortNames": ["wp"]},
                {"name": "workerpools/status", "singularName": "", "namespaced": True, "kind": "WorkerPool",
                 "verbs": ["get", "patch"]}]})
        if path == group and request.query.get("watch") == "true":
            response = web.StreamResponse()
            await response.prepare(request)
            while not self.closing:  # no events: the list is all kopf needs here
                await asyncio.sleep(0.1)
            return response
        if path == group:
            return web.json_response({"kind": "WorkerPoolList", "apiVersion": "taskherd.io/v1alpha1",
                                      "metadata": {"resourceVersion": "1"}, "items": [self.pool]})
        if path == f"{group}/pool/status" and method == "PATCH":
            self.pool["status"] = {**self.pool.get("status", {}), **body["status"]}
            return web.json_response(self.pool)
        if path == f"/api/v1/namespaces/{NS}/secrets/broker":
            return web.json_response(self.secret)
        if path == f"/apis/apps/v1/namespaces/{NS}/deployments/workers/scale":
            if method == "PATCH":
                self.replicas = body["spec"]["replicas"]
            return web.json_response({"kind": "Scale", "apiVersion": "autoscaling/v1",
                                      "metadata": {"name": "workers", "namespace": NS},
                                      "spec": {"replicas": self.replicas},
                                      "status": {"replicas": self.replicas, "selector": "app=workers"}})
        if path in (f"/api/v1/namespaces/{NS}/pods", f"/api/v1/namespaces/{NS}/events") and method == "GET":
            return web.json_response({"kind": "List", "metadata": {}, "items": []})
        if path == f"/api/v1/namespaces/{NS}/events" and method == "POST":
            return web.json_response(body, status=201)
        return web.json_response({"kind": "Status", "code": 404, "message": f"no route {method} {path}"}, status=404)


def serve(api: MockApi) -> tuple[int, callable]:
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(api.app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def stop() -> None:
        api.closing = True
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
    return port, stop


def test_kopf_wiring_scales_and_reports_through_the_subresources(redis_url, unique_name, tmp_path, monkeypatch):
    redis.Redis.from_url(redis_url).lpush(unique_name, *[json.dumps({"body": "", "headers": {}}) for _ in range(12)])
    api = MockApi(redis_url, unique_name)
    port, stop = serve(api)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "mock",
        "clusters": [{"name": "mock", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "mock", "user": {"token": "t"}}],
        "contexts": [{"name": "mock", "context": {"cluster": "mock", "user": "mock"}}]}))
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    import kubernetes_asyncio.config.kube_config as kube_config  # kopf's login reads this, set at import

    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("TASKHERD_LEADER_ELECTION", "false")
    monkeypatch.setenv("TASKHERD_OPERATOR_METRICS_PORT", "0")
    try:
        with KopfRunner(["run", "-m", "taskherd.operator.handlers", "--standalone", "-n", NS]) as runner:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not (api.replicas == 3 and api.pool.get("status")):
                time.sleep(0.2)
    finally:
        stop()
    assert runner.exception is None, runner.output[-3000:]
    scale = [r for r in api.requests if r[0] == "PATCH" and r[1].endswith("/deployments/workers/scale")]
    assert scale and scale[0][2].startswith("application/merge-patch+json") and scale[0][3] == {"spec": {"replicas": 3}}
    status = [r for r in api.requests if r[0] == "PATCH" and r[1].endswith("/workerpools/pool/status")]
    assert status and status[0][2].startswith("application/merge-patch+json")
    assert api.pool["status"]["observedDepth"] == 12 and api.pool["status"]["desiredReplicas"] == 3
    assert not [r for r in api.requests if r[0] == "PATCH" and r[1].endswith("/workerpools/pool")], \
        "no finalizer or annotation on the WorkerPool itself"
