"""The apply step of a poll: carry a Plan out through the API and the page targets, then report.

`apply` writes what was decided: deletion costs before the scale-down (so the ReplicaSet removes
the idle pods), the scale, the pages. `report` then posts the Events and writes the status, which
depend on how that went. A failed write is reported in the Outcome (the next poll tries again);
it never stops the other writes.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Mapping

from taskherd.contract import redact

from .alerts import deliver
from .deletion_cost import ANNOTATION
from .plan import EventSpec, Outcome, Plan, Snapshot
from .settle import status_changed

if TYPE_CHECKING:
    from .poll import Deps

log = logging.getLogger("taskherd.operator")


async def apply(snapshot: Snapshot, planned: Plan, deps: "Deps") -> Outcome:
    outcome = Outcome()
    namespace, spec = snapshot.namespace, snapshot.spec
    try:
        for pod, cost in planned.deletion_costs.items():
            await deps.kube.annotate_pod(namespace, pod, ANNOTATION, str(cost))
        if planned.scale is not None:
            await deps.kube.set_scale(namespace, spec.target, planned.scale.replicas)
            outcome.scaled = True
    except Exception as exc:  # noqa: BLE001 - a condition; the next poll decides again
        outcome.errors.append("scale")
        outcome.scale_error = redact(f"{spec.target.describe(namespace)} not scaled: {type(exc).__name__}: {exc}")
    await _send_pages(snapshot, planned, deps, outcome)
    return outcome


async def report(snapshot: Snapshot, events: list[EventSpec], status: Mapping[str, Any], deps: "Deps") -> list[str]:
    """Posts the Events and writes the status (when it changed); returns the error kinds."""
    errors = []
    for event in events:
        try:
            await deps.kube.post_event(snapshot.namespace, dict(snapshot.body), type=event.type,
                                       reason=event.reason, message=event.message)
        except Exception as exc:  # noqa: BLE001 - an Event is best effort
            errors.append("event")
            log.warning("%s/%s: Event %s not posted: %s", snapshot.namespace, snapshot.name, event.reason, exc)
    return errors + await _write_status(snapshot, status, deps)


async def _send_pages(snapshot: Snapshot, planned: Plan, deps: "Deps", outcome: Outcome) -> None:
    delivery = planned.delivery
    if delivery is None:
        return
    alertmanager = delivery.alertmanager_url or (None if delivery.webhook_url else deps.default_alertmanager_url)
    if not (alertmanager or delivery.webhook_url):
        return
    for page in planned.pages:
        try:
            await deliver(page, alertmanager_url=alertmanager, webhook_url=delivery.webhook_url, poster=deps.poster,
                          pool=snapshot.name, namespace=snapshot.namespace, severity=delivery.severity,
                          threshold=delivery.threshold)
            outcome.delivered += 1
            deps.metrics.pages.labels(snapshot.namespace, snapshot.name, page.kind).inc()
        except Exception as exc:  # noqa: BLE001 - due again on the next poll
            outcome.errors.append("page")
            outcome.undelivered[page.queue] = redact(f"page for {page.queue} not delivered: "
                                                     f"{type(exc).__name__}: {exc}")
            log.warning("%s/%s: %s", snapshot.namespace, snapshot.name, outcome.undelivered[page.queue])


async def _write_status(snapshot: Snapshot, status: Mapping[str, Any], deps: "Deps") -> list[str]:
    if not status_changed(snapshot.previous_status, status):
        return []
    try:
        await deps.kube.patch_pool_status(snapshot.namespace, snapshot.name, dict(status))
    except Exception as exc:  # noqa: BLE001 - written again on the next poll that changes it
        log.warning("%s/%s: status not written: %s", snapshot.namespace, snapshot.name, exc)
        return ["status"]
    return []
