"""Rendering the chart with the project's pinned helm (built by `make helm-binary`)."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any, Iterable

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "taskherd"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
TASKHERD_HOME = Path(os.environ.get("TASKHERD_HOME", Path.home() / ".cache" / "taskherd"))


def pinned_versions() -> dict[str, str]:
    out = {}
    for line in (REPO / "e2e" / "cluster" / "versions.env").read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip()
    return out


VERSIONS = pinned_versions()
HELM = TASKHERD_HOME / "bin" / f"helm-{VERSIONS['HELM_VERSION']}" / "helm"
# Render for the cluster's Kubernetes: helm built from the module proxy defaults to v1.20
# capabilities, which the chart's kubeVersion (>= 1.29) rightly refuses.
KUBE_VERSION = VERSIONS["KUBERNETES_VERSION"]


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    if not HELM.exists():
        pytest.fail(f"helm {VERSIONS['HELM_VERSION']} not found at {HELM}: run `make helm-binary` "
                    "(bash e2e/cluster/build.sh helm)")
    result = subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=60)
    if check:
        assert result.returncode == 0, f"helm {' '.join(args[:1])} failed:\n{result.stderr}"
    return result


def set_args(values: dict[str, Any] | None) -> list[str]:
    """--set-json for each top-level key: exact types, no escaping surprises."""
    import json

    return [a for key, value in (values or {}).items() for a in ("--set-json", f"{key}={json.dumps(value)}")]


def template_args(values_files: Iterable[Path] = (), values: dict[str, Any] | None = None,
                  release: str = "th", namespace: str = "jobs") -> list[str]:
    args = ["template", release, str(CHART), "--namespace", namespace, "--kube-version", KUBE_VERSION]
    for f in values_files:
        args += ["-f", str(f)]
    return args + set_args(values)


def render(values_files: Iterable[Path] = (), values: dict[str, Any] | None = None,
           **kw: str) -> list[dict]:
    """The rendered objects (parsed YAML). Raises AssertionError with helm's message on failure."""
    result = helm(*template_args(values_files, values, **kw), check=False)
    assert result.returncode == 0, f"helm template failed:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def render_error(values_files: Iterable[Path] = (), values: dict[str, Any] | None = None) -> str:
    """helm's error message for values that must be refused."""
    result = helm(*template_args(values_files, values), check=False)
    assert result.returncode != 0, "helm template accepted values it should refuse"
    return result.stderr


def by_kind(objects: list[dict], kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


BROKER = {"broker": {"existingSecret": {"name": "celery-broker"}}}


def exported_metric_names() -> set[str]:
    """Every metric name the project's programs export, read from the code that defines them (the
    worker's metrics, the exporter's families, the operator's metrics), with the sample suffixes
    Prometheus adds by type (counter `_total`, histogram `_bucket`/`_count`/`_sum`)."""
    from prometheus_client import CollectorRegistry

    from taskherd.commands.exporter import Snapshot, metric_families
    from taskherd.operator.metrics import OperatorMetrics
    from taskherd.worker.components.metrics import TaskMetrics, build_info, heartbeat_timestamp

    registry = CollectorRegistry()
    TaskMetrics(registry=registry)
    OperatorMetrics(registry=registry)
    families = [*registry.collect(), *metric_families(Snapshot(), {}), heartbeat_timestamp(None), build_info()]
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",),
                "info": ("_info",), "summary": ("_count", "_sum"), "unknown": ("",)}
    return {family.name + suffix for family in families for suffix in suffixes[family.type]}


SCHEMA_REFUSAL = "values don't meet the specifications of the schema"
RULES_REFUSAL = "problem(s) in the values"
#: What a template crash or a broken rendering looks like: never an acceptable way to refuse.
CRASHES = ("nil pointer", "error converting YAML", "error calling", "wrong type for value", "index out of range",
           "cannot unmarshal", "mapping key", "incompatible types")


def names_key(message: str, key: str) -> bool:
    """The message names `key` or a key inside it: as written (dotted, with [i]), or as the schema's
    JSON pointer, or as the schema's `missing property` of its parent."""
    if key in message:
        return True
    parts = [p for p in re.split(r"\.|\[(\d+)\]", key) if p]
    pointer = "/" + "/".join(parts)
    if f"'{pointer}'" in message or f"'{pointer}/" in message:
        return True
    parent = "/" + "/".join(parts[:-1]) if len(parts) > 1 else ""
    return f"at '{parent}': missing property '{parts[-1]}'" in message


def excluded_from_dry_run(obj: dict) -> bool:
    """What a dry run of `helm install` cannot judge: the Prometheus Operator's kinds (this cluster has
    no such CRDs), and the `helm test` pod, which `helm test` creates after the install (its
    ServiceAccount may be one the install creates; test_helm_test_... runs it for real)."""
    hook = (obj.get("metadata", {}).get("annotations") or {}).get("helm.sh/hook")
    return obj["apiVersion"].startswith("monitoring.coreos.com/") or hook == "test"
