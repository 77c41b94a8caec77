"""``taskherd_build_info``: which taskherd, Celery and Python run, served by the worker and the exporter.

A gauge that is always 1, labelled with the versions, as Prometheus' own ``prometheus_build_info``:
join on it in queries (``… * on (pod) group_left(version) taskherd_build_info``).
"""
from __future__ import annotations

import platform
from importlib import metadata

from prometheus_client.core import GaugeMetricFamily


def version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "unknown"


def build_info() -> GaugeMetricFamily:
    family = GaugeMetricFamily("taskherd_build_info", "Versions of taskherd, Celery and Python; always 1.",
                               labels=["version", "celery", "python"])
    family.add_metric([version("taskherd"), version("celery"), platform.python_version()], 1.0)
    return family
