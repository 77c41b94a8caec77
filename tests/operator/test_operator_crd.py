"""The WorkerPool CRD read as a KEDA user or `kubectl explain` reads it (no cluster needed; the API
server's view of the same file is in test_operator_cluster.py and test_workerpool_corpus.py)."""
from __future__ import annotations

from pathlib import Path

import yaml

CRD = Path(__file__).resolve().parents[2] / "charts" / "taskherd" / "crds" / "workerpools.taskherd.io.yaml"


def version() -> dict:
    return yaml.safe_load(CRD.read_text())["spec"]["versions"][0]


def walk(schema: dict, path: str):
    """Every (path, schema) below `schema`: properties, array items, map values."""
    yield path, schema
    for name, child in (schema.get("properties") or {}).items():
        yield from walk(child, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from walk(schema["additionalProperties"], f"{path}{{}}")


def test_every_field_is_described():
    root = version()["schema"]["openAPIV3Schema"]
    # metadata is the standard ObjectMeta: kubectl explain documents it from the API itself.
    undescribed = [path for path, schema in walk(root, "workerpool")
                   if path != "workerpool.metadata" and not (schema.get("description") or "").strip()]
    assert undescribed == [], f"fields without a description (kubectl explain shows nothing): {undescribed}"


def test_the_status_is_structural_with_conditions_as_a_list_map():
    status = version()["schema"]["openAPIV3Schema"]["properties"]["status"]
    preserved = [path for path, schema in walk(status, "status") if schema.get("x-kubernetes-preserve-unknown-fields")]
    assert preserved == [], f"status fields that keep whatever is written: {preserved}"
    conditions = status["properties"]["conditions"]
    assert (conditions["x-kubernetes-list-type"], conditions["x-kubernetes-list-map-keys"]) == ("map", ["type"])
    item = conditions["items"]
    assert set(item["required"]) == {"type", "status", "lastTransitionTime", "reason", "message"}
    assert "observedGeneration" in item["properties"]


def test_kubectl_get_shows_the_columns_a_keda_user_looks_for():
    columns = {c["name"]: c for c in version()["additionalPrinterColumns"]}
    default = [name for name, c in columns.items() if not c.get("priority")]
    assert default == ["Min", "Max", "Replicas", "Desired", "Depth", "Oldest", "DLQ", "Ready", "Status", "Age"]
    assert columns["Ready"]["jsonPath"] == '.status.conditions[?(@.type=="Ready")].status'
    assert columns["Status"]["jsonPath"] == '.status.conditions[?(@.type=="Ready")].reason'
    assert all(c.get("description") for c in columns.values())
