"""Leader election on a coordination.k8s.io Lease, as client-go does it, so two replicas are safe.

Why not kopf's peering: peers of equal priority both keep running (kopf only warns), and it needs
its own cluster-scoped CRD. A Lease is the Kubernetes convention. Every replica runs kopf (so its
watch is warm and its liveness endpoint answers); only the holder of the Lease polls and scales.

Expiry is judged the client-go way, on this replica's monotonic clock: a Lease held by someone
else is taken over only after its content has not changed for leaseDurationSeconds, so clock
skew between nodes cannot make two leaders.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

from kubernetes_asyncio import client
from kubernetes_asyncio.client.rest import ApiException

log = logging.getLogger("taskherd.operator.leader")

#: defaults as client-go's leaderelection (15 s lease, renew every 2 s within a 10 s deadline).
LEASE_SECONDS = 15
RENEW_EVERY_SECONDS = 2.0


@dataclass
class Observed:
    """The Lease content last seen and when (monotonic), to judge expiry without trusting clocks."""

    holder: str | None
    renew_time: str | None
    seen_at: float


def may_acquire(lease_spec: dict[str, Any] | None, observed: Observed | None, *, me: str,
                now_monotonic: float, lease_seconds: float) -> bool:
    """True when `me` may write itself into the Lease (pure)."""
    if not lease_spec:
        return True
    holder = lease_spec.get("holderIdentity")
    if not holder or holder == me:
        return True
    if observed is None or observed.holder != holder or observed.renew_time != lease_spec.get("renewTime"):
        return False  # someone renewed since we last looked: their lease runs from now
    return now_monotonic - observed.seen_at > float(lease_spec.get("leaseDurationSeconds") or lease_seconds)


def _micro_time(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(self, *, namespace: str, name: str, identity: str, api: client.ApiClient | None = None,
                 lease_seconds: int = LEASE_SECONDS, renew_every: float = RENEW_EVERY_SECONDS,
                 monotonic: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self.namespace, self.name, self.identity = namespace, name, identity
        self.api = client.CoordinationV1Api(api) if api is not None else None
        self.lease_seconds, self.renew_every = lease_seconds, renew_every
        self._monotonic, self._wall = monotonic, wall
        self._observed: Observed | None = None
        self._renewed_at = -float("inf")
        self.leading = asyncio.Event()

    @property
    def is_leading(self) -> bool:
        # Stop acting before the lease could expire in the others' eyes, even if the renew loop hangs.
        if self.leading.is_set() and self._monotonic() - self._renewed_at > self.lease_seconds * 2 / 3:
            self.leading.clear()
        return self.leading.is_set()

    async def try_once(self) -> bool:
        api = self.api or client.CoordinationV1Api()
        now = self._monotonic()
        try:
            lease = api.api_client.sanitize_for_serialization(
                await api.read_namespaced_lease(self.name, self.namespace))
        except ApiException as exc:
            if exc.status != 404:
                raise
            lease = None
        spec = (lease or {}).get("spec") or {}
        if lease and (self._observed is None or self._observed.holder != spec.get("holderIdentity")
                      or self._observed.renew_time != spec.get("renewTime")):
            self._observed = Observed(spec.get("holderIdentity"), spec.get("renewTime"), now)
        if not may_acquire(spec if lease else None, self._observed, me=self.identity, now_monotonic=now,
                           lease_seconds=self.lease_seconds):
            return False
        stamp = _micro_time(self._wall())
        new_spec = {"holderIdentity": self.identity, "leaseDurationSeconds": self.lease_seconds, "renewTime": stamp}
        if spec.get("holderIdentity") != self.identity:
            new_spec.update(acquireTime=stamp, leaseTransitions=int(spec.get("leaseTransitions") or 0) + 1)
        else:
            new_spec.update(acquireTime=spec.get("acquireTime") or stamp,
                            leaseTransitions=int(spec.get("leaseTransitions") or 0))
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace}, "spec": new_spec}
        try:
            if lease is None:
                await api.create_namespaced_lease(self.namespace, body)
            else:
                body["metadata"]["resourceVersion"] = lease["metadata"]["resourceVersion"]
                await api.replace_namespaced_lease(self.name, self.namespace, body)
        except ApiException as exc:
            if exc.status in (409, 422):
                return False  # another replica wrote first
            raise
        self._renewed_at = now
        self._observed = Observed(self.identity, stamp, now)
        return True

    async def run(self) -> None:
        while True:
            try:
                won = await self.try_once()
            except Exception as exc:  # noqa: BLE001 - keep trying; is_leading expires on its own
                log.warning("lease %s/%s: %s", self.namespace, self.name, exc)
                won = None
            if won:
                if not self.leading.is_set():
                    log.info("acquired lease %s/%s as %s", self.namespace, self.name, self.identity)
                self.leading.set()
            elif won is False and self.leading.is_set():
                log.warning("lost lease %s/%s", self.namespace, self.name)
                self.leading.clear()
            await asyncio.sleep(self.renew_every)

    async def release(self) -> None:
        """On shutdown: hand over at once instead of making the other replica wait a lease."""
        if not self.leading.is_set():
            return
        self.leading.clear()
        api = self.api or client.CoordinationV1Api()
        try:
            lease = await api.read_namespaced_lease(self.name, self.namespace)
            if lease.spec.holder_identity == self.identity:
                lease.spec.holder_identity = None
                lease.spec.lease_duration_seconds = 1
                await api.replace_namespaced_lease(self.name, self.namespace, lease)
        except Exception as exc:  # noqa: BLE001
            log.warning("lease %s/%s not released: %s", self.namespace, self.name, exc)


class AlwaysLeader:
    """--standalone / single replica: no Lease."""

    is_leading = True

    async def run(self) -> None:
        await asyncio.Event().wait()

    async def release(self) -> None:
        return None
