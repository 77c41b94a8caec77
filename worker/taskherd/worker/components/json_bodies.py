"""Decodes JSON message bodies with one JSONDecoder instead of a new one per message.

kombu's JSON decoder (``kombu.utils.json.loads``) calls ``json.loads(s, object_hook=...)``, and
``json.loads`` given any keyword builds a new ``JSONDecoder`` — and its C scanner — for each call.
Celery decodes each task's body twice (the main process as the request is built, the pool child
as it runs it): ~50k instructions a decode through kombu's registry, ~33k with one decoder kept
(docs/benchmarks.md, "Celery's own hot paths"). :func:`loads` is kombu's decoder with the decoder
kept: the same values (kombu's object hook, so the types kombu and Celery register still decode)
and, for anything but plain bytes or text, kombu's own function and errors. The component puts it
in kombu's serializer registry for ``application/json`` when the worker starts, before the pool
forks — unless the app registered a JSON decoder of its own, which it leaves alone.
"""
from __future__ import annotations

import json
from typing import Any

from kombu.utils import json as kombu_json

from taskherd import compat

from . import AtWorkerStart

#: What json.loads(s, object_hook=kombu's hook) builds for every call, built once (the json module
#: shares its own default decoder between threads the same way).
_decoder = json.JSONDecoder(object_hook=kombu_json.object_hook)


def loads(s: Any) -> Any:
    """``kombu.utils.json.loads(s)``, without a new decoder per call."""
    if type(s) is bytes:
        s = s.decode("utf-8")
    if type(s) is str and not s.startswith("\ufeff"):  # json.loads refuses a BOM: kombu's path says so
        return _decoder.decode(s)
    return kombu_json.loads(s)


class JsonBodies(AtWorkerStart):
    """Registers :func:`loads` as kombu's JSON decoder as the worker starts."""

    @staticmethod
    def at_worker_start(**_: Any) -> None:
        compat.use_json_body_decoder(loads, replacing=kombu_json.loads)
