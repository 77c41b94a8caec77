"""Every value is documented where it is defined, in the README table, and in the schema."""
from __future__ import annotations

import json
import subprocess
import sys

import yaml

from chart_support import CHART

GEN = CHART / "hack" / "gen-readme.py"


def test_readme_values_table_is_generated_from_values_yaml_and_up_to_date():
    result = subprocess.run([sys.executable, str(GEN), "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def _resolve(schema: dict, root: dict) -> dict:
    """The schema node with `$ref`s followed and `allOf` members merged (properties, required)."""
    if "$ref" in schema:
        node = root
        for part in schema["$ref"].lstrip("#/").split("/"):
            node = node[part]
        return _resolve(node, root)
    if "allOf" in schema:
        merged: dict = {"properties": {}, "required": []}
        for member in schema["allOf"]:
            member = _resolve(member, root)
            for key, value in member.items():
                if key == "properties":
                    for name, sub in value.items():
                        merged["properties"].setdefault(name, {"allOf": []})["allOf"].append(sub)
                elif key == "required":
                    merged["required"] += value
                else:
                    merged[key] = value
        return merged
    return schema


def _schema_paths(schema: dict, root: dict, prefix: str = "") -> set[str]:
    schema = _resolve(schema, root)
    out = set()
    for key, sub in schema.get("properties", {}).items():
        out.add(prefix + key)
        out |= _schema_paths(sub, root, prefix + key + ".")
    return out


def _value_paths(values: dict, prefix: str = "") -> set[str]:
    out = set()
    for key, value in values.items():
        out.add(prefix + key)
        # Free-form maps (resources, selectors, labels) are typed as objects, not key by key.
        if isinstance(value, dict) and key not in ("resources", "namespaceSelector", "podSelector", "labels"):
            out |= _value_paths(value, prefix + key + ".")
    return out


def test_schema_declares_every_value_and_refuses_unknown_keys():
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    missing = _value_paths(values) - _schema_paths(schema, schema)
    assert missing == set()

    def closed(node: dict, where: str) -> None:
        if "allOf" in node or "$ref" in node:
            return  # a reference to a definition checked on its own below
        if node.get("type") == "object" and "properties" in node and where != "values.global":
            # (`global` is shared with parent charts: their keys are not ours to refuse.)
            assert node.get("additionalProperties") is False, f"{where} accepts unknown keys"
        for key, sub in node.get("properties", {}).items():
            closed(sub, f"{where}.{key}")

    closed(schema, "values")
    closed(schema["definitions"]["pool"], "workerPools[]")
    # A pool entry accepts exactly the keys of workerPoolDefaults, plus its name.
    pool_keys = set(schema["definitions"]["pool"]["properties"])
    assert pool_keys == set(values["workerPoolDefaults"]) | {"name"}


def test_every_integer_value_has_a_maximum():
    """docs/chart.md promises it (no sum of values overflows); a uid, gid or fsGroup is Kubernetes'
    int32 (0..2147483647)."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    unbounded = []

    def walk(node: object, where: str) -> None:
        if isinstance(node, dict):
            kind = node.get("type")
            if (kind == "integer" or (isinstance(kind, list) and "integer" in kind)) and "maximum" not in node:
                unbounded.append(where)
            for key, sub in node.items():
                walk(sub, f"{where}/{key}")
        elif isinstance(node, list):
            for i, sub in enumerate(node):
                walk(sub, f"{where}[{i}]")

    walk(schema, "")
    assert unbounded == []
    security = schema["properties"]["podSecurityContext"]["properties"]
    assert {security[k]["maximum"] for k in ("runAsUser", "runAsGroup", "fsGroup")} == {2**31 - 1}


def test_every_structured_default_is_required_so_null_never_reaches_a_template():
    """Helm deletes a default set to null (`timeLimits: null`); the schema must then say which key is
    missing rather than let a template dereference nothing."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    unguarded = []

    def walk(node: dict, default: object, where: str) -> None:
        node = _resolve(node, schema)
        if not (isinstance(default, dict) and "properties" in node):
            return
        for key, value in default.items():
            if key in node["properties"] and key not in node.get("required", []):
                unguarded.append(f"{where}{key}")
            if key in node["properties"]:
                walk(node["properties"][key], value, f"{where}{key}.")

    walk(schema, {k: v for k, v in values.items() if k not in ("workerPools", "global")}, "")
    assert unguarded == []
