"""Reads each delivered message's AMQP properties with taskherd's decoder instead of py-amqp's.

py-amqp decodes a message's content header (Celery's twenty task headers among its properties) in
pure Python through a generic format interpreter: ~195k instructions a message on RabbitMQ, a sixth
of what vanilla Celery's worker spends on a whole no-op task. taskherd.worker.amqp_properties gives
the same properties — the same values, types and errors — in ~115k (docs/benchmarks.md, "Celery's own
hot paths"). Installed when the worker starts, in its main process (the one that reads the
broker); nothing changes on Redis, whose transport does not use py-amqp.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from taskherd import compat

from . import Component

_DISPATCH_UID = "taskherd.worker.components.amqp_headers"


def install_decoder(**_: Any) -> None:
    compat.use_amqp_properties_decoder()


@dataclasses.dataclass(frozen=True, kw_only=True)
class AmqpHeaders(Component):
    """Connects :func:`install_decoder` to Celery's ``worker_init``."""

    def install(self, app: Any, profile: Any = None) -> None:
        from celery.signals import worker_init

        worker_init.connect(install_decoder, weak=False, dispatch_uid=_DISPATCH_UID)
