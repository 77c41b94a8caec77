"""The observe step of a poll: read everything one WorkerPool's decision needs, change nothing.

Reads the spec, the queues (through the broker Secret), the scale subresource of the target, and
the worker pods when they matter (their busyness before a possible scale-down, their terminations
every TERMINATIONS_EVERY_SECONDS, and the pool-child deaths their workers counted at both). A
failed read becomes a `Problem` in the snapshot, never an exception: the plan turns it into a
condition.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Mapping

from taskherd.contract import redact

from .busyness import read_busyness
from .child_deaths import read_child_deaths
from .deletion_cost import ANNOTATION
from .kube import NotFound, Scale, Unsupported
from .pause import pause_from, unreadable
from .plan import PoolMemory, Problem, Snapshot, needs_busyness
from .policy import InvalidSpec, parse_spec_cached

if TYPE_CHECKING:
    from .poll import Deps

log = logging.getLogger("taskherd.operator")


def _error_text(exc: BaseException) -> str:
    return redact(f"{type(exc).__name__}: {exc}")


async def observe(body: Mapping[str, Any], memory: PoolMemory, deps: "Deps", *,
                  conflict: Problem | None = None) -> Snapshot:
    """`conflict`: another pool scales this pool's target (the scheduler's finding): this one only
    observes and reports, so its worker pods are not read for a scale-down."""
    now = deps.clock()
    meta = body["metadata"]
    namespace = meta["namespace"]
    try:
        spec = parse_spec_cached(body.get("spec") or {})
    except InvalidSpec as exc:
        return Snapshot(body=body, now=now, spec_problem=Problem("InvalidSpec", str(exc)), errors=("spec",))
    errors: list[str] = []
    try:
        pause = pause_from(meta.get("annotations"))
    except Exception as exc:  # noqa: BLE001 - pause_from takes any value; never a failed poll
        log.exception("%s/%s: pause annotations not read", namespace, meta.get("name"))
        pause = unreadable(exc)
    read: dict[str, Any] = {"pause": pause}
    try:
        read["observation"] = await deps.observe(namespace, spec.broker)
    except Exception as exc:  # noqa: BLE001 - a condition, not a crash loop
        errors.append("broker")
        read["broker_problem"] = Problem(getattr(exc, "reason", "BrokerUnreachable"),
                                         redact(str(exc)) or type(exc).__name__)
    target = spec.target.describe(namespace)
    try:
        read["scale"] = await deps.kube.get_scale(namespace, spec.target)
    except NotFound:
        errors.append("scale")
        read["scale_problem"] = Problem("ScaleTargetNotFound", f"{target} not found")
    except Unsupported as exc:
        errors.append("scale")
        read["scale_problem"] = Problem("ScaleTargetUnsupported", f"{target} cannot be scaled: {exc}")
    except Exception as exc:  # noqa: BLE001 - API errors (403, 5xx, timeouts) are conditions too
        errors.append("scale")
        read["scale_problem"] = Problem("FailedGetScale", f"scale of {target} not read: {_error_text(exc)}")

    scale: Scale | None = read.get("scale")
    want_busyness = scale is not None and conflict is None and needs_busyness(
        spec, read["pause"], read.get("observation"), scale.replicas, memory, now)
    # A scale subresource without a selector (a custom resource may declare none) names no pods:
    # listing with an empty selector would read every pod of the namespace.
    has_pods = scale is not None and bool(scale.selector)
    want_busyness, want_terminations = has_pods and want_busyness, has_pods and memory.terminations_due(now)
    if want_busyness or want_terminations:
        try:
            pods = await deps.kube.list_pods(namespace, scale.selector)
        except Exception as exc:  # noqa: BLE001 - busyness unknown: the plan keeps every pod
            errors.append("busyness")
            log.warning("%s/%s: worker pods not read: %s", namespace, meta["name"], _error_text(exc))
            read["busyness_unreadable"] = want_busyness
            pods = None
        if pods is not None and want_busyness:
            read["busyness"] = tuple(await read_busyness(pods, deps.busyness))
            read["cost_annotations"] = {p["metadata"]["name"]: (p["metadata"].get("annotations") or {}).get(ANNOTATION)
                                        for p in pods}
        # Pool-child deaths are read with every busyness reading too (the same /metrics text): a
        # pod this poll may remove would take its unreported deaths with it, and an idle pod whose
        # children were just killed is the one a scale-down removes first.
        if pods is not None and (want_terminations or want_busyness):
            try:
                if want_terminations:
                    read["pod_events"] = tuple(await deps.kube.list_pod_events(namespace))
                    read["pods"] = tuple(pods)
                if deps.child_deaths is not None:  # a pod that cannot be read is left out
                    read["child_deaths"] = {pod: tuple(deaths) for pod, deaths in
                                            (await read_child_deaths(pods, deps.child_deaths)).items()}
            except Exception as exc:  # noqa: BLE001 - the report is best effort
                errors.append("terminations")
                log.warning("%s/%s: terminations not read: %s", namespace, meta["name"], _error_text(exc))
    return Snapshot(body=body, now=now, spec=spec, errors=tuple(errors), conflict=conflict, **read)
