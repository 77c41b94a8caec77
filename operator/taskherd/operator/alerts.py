"""Delivering pages: Alertmanager's v2 API (`POST /api/v2/alerts`) or a plain JSON webhook."""
from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable

import httpx

from .paging import Page

ALERT_NAME = "TaskherdDeadLetterQueue"

#: (target url, JSON body) -> None; raises on failure. Injected in tests.
Poster = Callable[[str, Any], Awaitable[None]]


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat().replace("+00:00", "Z")


def alertmanager_alert(page: Page, *, pool: str, namespace: str, severity: str, threshold: int) -> dict[str, Any]:
    """One alert of Alertmanager's v2 schema. Identity = the label set, so re-sends update it."""
    return {
        "labels": {"alertname": ALERT_NAME, "pool": pool, "namespace": namespace,
                   "queue": page.queue, "severity": severity},
        "annotations": {
            "summary": f"dead-letter queue {page.queue} of WorkerPool {namespace}/{pool} holds {page.depth} messages",
            "description": f"threshold {threshold}; inspect with `taskherd dlq` and redrive or purge",
        },
        "startsAt": rfc3339(page.starts_at),
        "endsAt": rfc3339(page.ends_at),
    }


def webhook_body(page: Page, *, pool: str, namespace: str, severity: str, threshold: int) -> dict[str, Any]:
    return {"status": "resolved" if page.kind == "resolve" else "firing", "event": page.kind,
            "pool": pool, "namespace": namespace, "queue": page.queue, "depth": page.depth,
            "threshold": threshold, "severity": severity,
            "startsAt": rfc3339(page.starts_at), "endsAt": rfc3339(page.ends_at)}


class HttpPoster:
    def __init__(self, *, timeout: float = 5.0, client: httpx.AsyncClient | None = None) -> None:
        self._client = client or httpx.AsyncClient(timeout=timeout)

    async def __call__(self, url: str, body: Any) -> None:
        response = await self._client.post(url, json=body)
        response.raise_for_status()


class DryRunPoster:
    """Logs the page it would POST (`**DRY-RUN**: would …`) instead of sending it."""

    def __init__(self, log: logging.Logger | None = None) -> None:
        self.log = log or logging.getLogger("taskherd.operator")

    async def __call__(self, url: str, body: Any) -> None:
        self.log.info("**DRY-RUN**: would POST a page to %s: %s", url, body)


async def deliver(page: Page, *, alertmanager_url: str | None, webhook_url: str | None, poster: Poster,
                  pool: str, namespace: str, severity: str, threshold: int) -> None:
    """POST the page to every configured target; raises the first failure after trying all."""
    failures: list[Exception] = []
    targets = []
    if alertmanager_url:
        targets.append((alertmanager_url.rstrip("/") + "/api/v2/alerts",
                        [alertmanager_alert(page, pool=pool, namespace=namespace, severity=severity, threshold=threshold)]))
    if webhook_url:
        targets.append((webhook_url, webhook_body(page, pool=pool, namespace=namespace, severity=severity,
                                                  threshold=threshold)))
    for url, body in targets:
        try:
            await poster(url, body)
        except Exception as exc:  # noqa: BLE001 - reported to the caller, who keeps the page due
            failures.append(exc)
    if failures:
        raise failures[0]
