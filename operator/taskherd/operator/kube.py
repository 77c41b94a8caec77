"""The one module that talks to the Kubernetes API (kubernetes_asyncio). Everything returns plain
dicts in the API's camelCase, so the rest of the operator (and its fakes in tests) never sees
client model classes. The exact verbs used here are listed in rbac.md."""
from __future__ import annotations

import base64
import logging
import os
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Protocol

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.rest import ApiException

from .policy import ScaleTargetRef

GROUP, VERSION, PLURAL = "taskherd.io", "v1alpha1", "workerpools"
MERGE_PATCH = "application/merge-patch+json"
FIELD_MANAGER = "taskherd-operator"
#: how long the resources an API group serves are remembered (a CRD installed later is seen then).
DISCOVERY_TTL_SECONDS = 60.0


class NotFound(LookupError):
    pass


class Unsupported(LookupError):
    """The scale target's kind is not served, or has no scale subresource."""


@dataclass(frozen=True)
class Scale:
    """The scale subresource of a target: replicas asked for, replicas that exist, pod selector
    (empty when the target's scale subresource declares none)."""

    replicas: int
    current_replicas: int
    selector: str


class Kube(Protocol):
    """What a poll needs from the API; tests implement it in memory, DryRunKube logs its writes."""

    async def read_secret(self, namespace: str, name: str) -> dict[str, str]: ...
    async def get_scale(self, namespace: str, target: ScaleTargetRef) -> Scale:
        """The target's scale subresource; raises NotFound or Unsupported."""
    async def set_scale(self, namespace: str, target: ScaleTargetRef, replicas: int) -> None: ...
    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]: ...
    async def list_pod_events(self, namespace: str) -> list[dict[str, Any]]: ...
    async def annotate_pod(self, namespace: str, name: str, key: str, value: str) -> None: ...
    async def patch_pool_status(self, namespace: str, name: str, status: dict[str, Any]) -> None: ...
    async def post_event(self, namespace: str, pool: dict[str, Any], *, type: str, reason: str,
                         message: str) -> None: ...


async def load_config() -> None:
    """In-cluster service account when running in a pod, else $KUBECONFIG / ~/.kube/config."""
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()
    else:
        await config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))


def _not_found(exc: ApiException, what: str) -> Exception:
    return NotFound(what) if exc.status == 404 else exc


class ApiKube:
    def __init__(self, api_client: client.ApiClient | None = None) -> None:
        self.api = api_client or client.ApiClient()
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        #: apiVersion -> (read at, {kind: (plural, has a scale subresource)})
        self._resources: dict[str, tuple[float, dict[str, tuple[str, bool]]]] = {}

    def _plain(self, obj: Any) -> Any:
        return self.api.sanitize_for_serialization(obj)

    async def read_secret(self, namespace: str, name: str) -> dict[str, str]:
        try:
            secret = await self.core.read_namespaced_secret(name, namespace)
        except ApiException as exc:
            raise _not_found(exc, f"Secret {namespace}/{name}") from exc
        return {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}

    async def _kinds(self, api_version: str, *, refresh: bool = False) -> dict[str, tuple[str, bool]]:
        """API discovery of one group/version (allowed to every authenticated user)."""
        cached = self._resources.get(api_version)
        if cached and not refresh and time.monotonic() - cached[0] < DISCOVERY_TTL_SECONDS:
            return cached[1]
        try:
            listing = await self.api.call_api(
                f"/apis/{api_version}", "GET", header_params={"Accept": "application/json"},
                response_types_map={200: "object"}, auth_settings=["BearerToken"], _return_http_data_only=True)
        except ApiException as exc:
            if exc.status != 404:
                raise
            listing = {}
        names = {r["name"] for r in listing.get("resources") or []}
        kinds = {r["kind"]: (r["name"], f"{r['name']}/scale" in names)
                 for r in listing.get("resources") or [] if "/" not in r["name"]}
        self._resources[api_version] = (time.monotonic(), kinds)
        return kinds

    async def _plural(self, target: ScaleTargetRef) -> str:
        kinds = await self._kinds(target.api_version)
        if target.kind not in kinds:  # perhaps served since we last looked
            kinds = await self._kinds(target.api_version, refresh=True)
        if target.kind not in kinds:
            raise Unsupported(f"kind {target.kind} is not served by {target.api_version}")
        plural, scalable = kinds[target.kind]
        if not scalable:
            raise Unsupported(f"{target.kind} ({target.api_version}) has no scale subresource")
        return plural

    async def get_scale(self, namespace: str, target: ScaleTargetRef) -> Scale:
        plural = await self._plural(target)
        try:
            scale = await self.custom.get_namespaced_custom_object_scale(
                target.group, target.version, namespace, plural, target.name)
        except ApiException as exc:
            raise _not_found(exc, target.describe(namespace)) from exc
        spec, status = scale.get("spec") or {}, scale.get("status") or {}
        return Scale(int(spec.get("replicas") or 0), int(status.get("replicas") or 0), status.get("selector") or "")

    async def set_scale(self, namespace: str, target: ScaleTargetRef, replicas: int) -> None:
        await self.custom.patch_namespaced_custom_object_scale(
            target.group, target.version, namespace, await self._plural(target), target.name,
            {"spec": {"replicas": replicas}}, field_manager=FIELD_MANAGER, _content_type=MERGE_PATCH)

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        pods = await self.core.list_namespaced_pod(namespace, label_selector=selector)
        return self._plain(pods)["items"]

    async def list_pod_events(self, namespace: str) -> list[dict[str, Any]]:
        events = await self.core.list_namespaced_event(namespace, field_selector="involvedObject.kind=Pod")
        return self._plain(events)["items"]

    async def annotate_pod(self, namespace: str, name: str, key: str, value: str) -> None:
        try:
            await self.core.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": {key: value}}},
                                                 field_manager=FIELD_MANAGER, _content_type=MERGE_PATCH)
        except ApiException as exc:
            if exc.status != 404:  # a pod that went away needs no cost
                raise

    async def patch_pool_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        await self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, name, {"status": status}, field_manager=FIELD_MANAGER,
            _content_type=MERGE_PATCH)

    async def post_event(self, namespace: str, pool: dict[str, Any], *, type: str, reason: str,
                         message: str) -> None:
        now = datetime.now(timezone.utc)
        meta = pool.get("metadata") or {}
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{meta.get('name', 'workerpool')}.", namespace=namespace),
            involved_object=client.V1ObjectReference(
                api_version=f"{GROUP}/{VERSION}", kind="WorkerPool", name=meta.get("name"), namespace=namespace,
                uid=meta.get("uid"), resource_version=meta.get("resourceVersion")),
            reason=reason, message=message[:1024], type=type, first_timestamp=now, last_timestamp=now,
            count=1, source=client.V1EventSource(component=FIELD_MANAGER), reporting_component=FIELD_MANAGER,
            reporting_instance=os.environ.get("HOSTNAME", FIELD_MANAGER))
        await self.core.create_namespaced_event(namespace, event)

    async def close(self) -> None:
        await self.api.close()


class DryRunKube:
    """Reads through `inner`; every write is logged as kube-janitor does (`**DRY-RUN**: would …`)
    and not made. `python -m taskherd.operator --dry-run` shows what the operator would do to a
    cluster it does not own yet."""

    def __init__(self, inner: Kube, log: logging.Logger | None = None) -> None:
        self.inner = inner
        self.log = log or logging.getLogger("taskherd.operator")

    async def read_secret(self, namespace: str, name: str) -> dict[str, str]:
        return await self.inner.read_secret(namespace, name)

    async def get_scale(self, namespace: str, target: ScaleTargetRef) -> Scale:
        return await self.inner.get_scale(namespace, target)

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return await self.inner.list_pods(namespace, selector)

    async def list_pod_events(self, namespace: str) -> list[dict[str, Any]]:
        return await self.inner.list_pod_events(namespace)

    async def set_scale(self, namespace: str, target: ScaleTargetRef, replicas: int) -> None:
        self.log.info("**DRY-RUN**: would scale %s to %d replicas", target.describe(namespace), replicas)

    async def annotate_pod(self, namespace: str, name: str, key: str, value: str) -> None:
        self.log.info("**DRY-RUN**: would annotate pod %s/%s with %s=%s", namespace, name, key, value)

    async def patch_pool_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.log.info("**DRY-RUN**: would patch the status of WorkerPool %s/%s", namespace, name)

    async def post_event(self, namespace: str, pool: dict[str, Any], *, type: str, reason: str,
                         message: str) -> None:
        self.log.info("**DRY-RUN**: would post %s Event %s on WorkerPool %s/%s: %s", type, reason, namespace,
                      (pool.get("metadata") or {}).get("name"), message)
