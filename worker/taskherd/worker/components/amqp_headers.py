"""Reads each delivered message's AMQP properties with taskherd's decoder instead of py-amqp's.

py-amqp decodes a message's content header (Celery's twenty task headers among its properties) in
pure Python through a generic format interpreter: ~195k instructions a message on RabbitMQ, a sixth
of what vanilla Celery's worker spends on a whole no-op task. taskherd.worker.amqp_properties gives
the same properties — the same values, types and errors — in ~115k (docs/benchmarks.md, "Celery's own
hot paths"). Installed when the worker starts, in its main process (the one that reads the
broker); nothing changes on Redis, whose transport does not use py-amqp.
"""
from __future__ import annotations

from typing import Any

from taskherd import compat

from . import AtWorkerStart


class AmqpHeaders(AtWorkerStart):
    """Installs taskherd's decoder of AMQP properties as the worker starts."""

    @staticmethod
    def at_worker_start(**_: Any) -> None:
        compat.use_amqp_properties_decoder()
