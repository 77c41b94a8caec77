"""A WorkerPool's rules are written in three places that must agree: the CRD
(charts/taskherd/crds/workerpools.taskherd.io.yaml), the operator's `policy.parse_spec`, and the
chart's values that render into WorkerPools (values.schema.json, templates/_formats.tpl,
templates/_validate.tpl). Anything the chart renders must pass the CRD and parse_spec; anything the
CRD stores must pass parse_spec. Each test reads the files themselves, so a bound changed in one
place fails here until the others follow (the chart's own rendering: tests/chart/test_render.py)."""
from __future__ import annotations

import json
import re
import sys
import unicodedata
from pathlib import Path

import pytest
import yaml

from taskherd.operator import policy
from taskherd.operator.policy import InvalidSpec, parse_spec

CHART = Path(__file__).resolve().parents[2] / "charts" / "taskherd"
CRD = yaml.safe_load((CHART / "crds" / "workerpools.taskherd.io.yaml").read_text())
SPEC = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
VALUES_SCHEMA = json.loads((CHART / "values.schema.json").read_text())
POOL = VALUES_SCHEMA["definitions"]["pool"]["properties"]
_FORMATS = (CHART / "templates" / "_formats.tpl").read_text()
FORMATS = yaml.safe_load(_FORMATS.split('{{- define "taskherd.formats" -}}')[1].split("{{- end }}")[0])
VALIDATE = (CHART / "templates" / "_validate.tpl").read_text()
WORKERPOOL_TEMPLATE = (CHART / "templates" / "workerpool.yaml").read_text()

#: a pool's value -> the WorkerPool field templates/workerpool.yaml renders it into
RENDERED_AS = {
    "autoscaling.minReplicas": "minReplicas",
    "autoscaling.maxReplicas": "maxReplicas",
    "autoscaling.targetDepthPerWorker": "targetDepthPerWorker",
    "autoscaling.maxOldestMessageAgeSeconds": "maxOldestMessageAgeSeconds",
    "autoscaling.pollIntervalSeconds": "pollIntervalSeconds",
    "autoscaling.scaleDownStabilizationSeconds": "scaleDownStabilizationSeconds",
    "autoscaling.deadLetter.threshold": "deadLetter.threshold",
    "autoscaling.deadLetter.severity": "deadLetter.severity",
    "autoscaling.deadLetter.resendIntervalSeconds": "deadLetter.resendIntervalSeconds",
    "autoscaling.deadLetter.alertmanagerUrl": "deadLetter.alertmanagerUrl",
    "autoscaling.deadLetter.webhookUrl": "deadLetter.webhookUrl",
    "queues": "broker.queues",
    "deadLetterQueues": "broker.deadLetterQueues",
}

GOOD = {"scaleTargetRef": {"name": "workers"},
        "broker": {"type": "redis", "secretRef": {"name": "broker"}, "queues": ["emails"]},
        "minReplicas": 0, "maxReplicas": 10}


def _node(schema: dict, path: str) -> dict:
    for part in path.split("."):
        schema = schema["properties"][part]
    return schema


def _walk(schema: dict, prefix: str = ""):
    """(dotted path, node) for every property under `schema`."""
    for key, node in schema.get("properties", {}).items():
        yield prefix + key, node
        yield from _walk(node, f"{prefix}{key}.")


def _re2_class_to_python(pattern: str) -> str:
    """An RE2 pattern using \\p{Z} and \\p{Cc} in Python's re (which has no \\p): the classes spelled
    out from this Python's Unicode tables; RE2's \\s is ASCII only."""
    z = "".join(c for c in map(chr, range(sys.maxunicode + 1)) if unicodedata.category(c).startswith("Z"))
    return (pattern.replace(r"\s", r"\t\n\f\r ").replace(r"\p{Z}", re.escape(z))
            .replace(r"\p{Cc}", r"\x00-\x1f\x7f-\x9f"))


def test_every_integer_range_is_the_crds_in_the_operator_and_in_the_chart():
    crd = {path: (node["minimum"], node["maximum"]) for path, node in _walk(SPEC) if node.get("type") == "integer"}
    assert crd == policy.RANGES
    chart = {RENDERED_AS[path]: (node["minimum"], node["maximum"])
             for path, node in _walk(POOL["autoscaling"], "autoscaling.") if node.get("type") == "integer"}
    assert chart == crd


def test_the_chart_renders_every_value_it_bounds_for_the_crd():
    """Nothing under autoscaling escapes the comparison above: each value is rendered, and only
    the values RENDERED_AS names are (plus enabled, which decides whether there is a WorkerPool)."""
    values = {path for path, node in _walk(POOL["autoscaling"], "autoscaling.") if "properties" not in node}
    assert values - set(RENDERED_AS) == {"autoscaling.enabled"}
    used = {"autoscaling." + m for m in re.findall(r"\$as\.([\w.]+)", WORKERPOOL_TEMPLATE)}
    assert used - {"autoscaling.enabled"} == {p for p in RENDERED_AS if p.startswith("autoscaling.")}
    assert all(RENDERED_AS[p].split(".")[-1] in WORKERPOOL_TEMPLATE for p in RENDERED_AS)


def test_the_operator_takes_exactly_the_crds_fields():
    crd = {"": tuple(SPEC["properties"])}
    crd.update({path: tuple(node["properties"]) for path, node in _walk(SPEC) if "properties" in node})
    assert {k: set(v) for k, v in crd.items()} == {k: set(v) for k, v in policy.FIELDS.items()}


def test_enums_are_the_same_words_everywhere():
    severity = _node(SPEC, "deadLetter.severity")["enum"]
    assert severity == list(policy.SEVERITIES) == _node(POOL["autoscaling"], "deadLetter.severity")["enum"]
    (rule,) = _node(SPEC, "broker.type")["x-kubernetes-validations"]
    assert rule["rule"] == "self in [%s]" % ", ".join(f"'{t}'" for t in policy.BROKER_TYPES)
    assert VALUES_SCHEMA["properties"]["broker"]["properties"]["type"]["enum"] == list(policy.BROKER_TYPES)


@pytest.mark.parametrize("field", ["queues", "deadLetterQueues"])
def test_queue_lists_have_the_same_bounds_everywhere(field):
    crd, chart = _node(SPEC, f"broker.{field}"), POOL[field]
    assert crd["maxItems"] == chart["maxItems"] == policy.MAX_QUEUES
    assert crd["items"]["maxLength"] == chart["items"]["maxLength"] == policy.MAX_QUEUE_NAME_LENGTH
    assert crd["x-kubernetes-list-type"] == "set"  # the chart: "names a queue twice"; parse_spec: "distinct"
    # the same pattern in the CRD's rule and the chart's format, in RE2 and in the same words
    (rule,) = crd["items"]["x-kubernetes-validations"]
    assert rule["rule"] == "self.matches('%s')" % FORMATS["queue"]["re"].replace("\\", "\\\\")
    words = "without commas, whitespace or control characters"
    assert words in rule["message"] and words in FORMATS["queue"]["valid"] and words in policy.QUEUE_NAME_VALID


def test_a_default_dead_letter_queue_fits_everywhere():
    longest = policy.MAX_QUEUE_NAME_LENGTH_WITH_DEFAULT_DLQ
    assert longest + len(".dlq") == policy.MAX_QUEUE_NAME_LENGTH
    rules = [r["rule"] for r in _node(SPEC, "broker")["x-kubernetes-validations"]]
    assert any(f"self.queues.all(q, size(bytes(q)) <= {longest})" in r for r in rules)  # UTF-8 bytes, as RabbitMQ
    assert f"(gt (len (toString $q)) {longest})" in VALIDATE


def test_the_operators_queue_name_rule_is_the_re2_one_on_every_character():
    """QUEUE_NAME is ^[^,\\s\\p{Z}\\p{Cc}]+$ in Python's words: the same answer for every code point."""
    re2 = re.compile(_re2_class_to_python(FORMATS["queue"]["re"]))
    differ = [hex(cp) for cp in range(sys.maxunicode + 1)
              if bool(re2.match(chr(cp))) != bool(policy.QUEUE_NAME.match(chr(cp)))]
    assert differ == []


def test_urls_are_bounded_alike():
    port = policy.PORT.pattern.strip("^$")
    for fmt in ("url", "alertmanagerUrl"):
        assert f"(:{port})?" in FORMATS[fmt]["re"]
    for field in ("alertmanagerUrl", "webhookUrl"):
        node = _node(SPEC, f"deadLetter.{field}")
        assert node["maxLength"] == policy.MAX_URL_LENGTH
        # the port as a number (a regex over getPort() has an unbounded estimated cost: the API
        # server refuses the whole CRD), 1..65535 as PORT says
        assert any("int(url(self).getPort()) >= 1 && int(url(self).getPort()) <= 65535" in r["rule"]
                   for r in node["x-kubernetes-validations"])
    assert policy.PORT.match("1") and policy.PORT.match("65535") and not policy.PORT.match("65536")
    assert f'"format" (.format | default "url") "key" .key "value" .value "max" {policy.MAX_URL_LENGTH}' in VALIDATE


#: URLs as users write them: the chart's format decides; whatever it accepts, parse_spec must accept.
URLS = [
    "http://am:9093", "http://am:9093/", "https://alertmanager.monitoring.svc:9093/prefix", "http://[fd00::1]:9093",
    "http://am:1", "http://am:65535", "https://hooks.shop/a%20b", "https://hooks.shop/t?token=abc#x",
    "http://am:9093/?x=1", "http://am:9093/#frag", "http://am:99999", "http://am:0", "http://am:65536",
    "http://am:+1", "http://am:port", "http://", "ftp://am", "am:9093", "http://am/dead letters",
    "http://am/dead\u00a0letters", "http://am/\x01", "https://hooks.shop/%zz", "https://hooks.shop/%4",
    "http://[::1", "https://hooks.shop/" + "x" * 2030, "http://am:9093?x", "http://user@am",
]


@pytest.mark.parametrize("fmt,field", [("url", "webhookUrl"), ("alertmanagerUrl", "alertmanagerUrl")])
def test_what_the_chart_accepts_as_a_url_the_operator_accepts(fmt, field):
    chart = re.compile(_re2_class_to_python(FORMATS[fmt]["re"]))
    accepted = [url for url in URLS if chart.match(url) and len(url) <= policy.MAX_URL_LENGTH]
    assert len(accepted) >= 5
    refused = []
    for url in accepted:
        try:
            parse_spec({**GOOD, "deadLetter": {field: url}})
        except InvalidSpec as exc:
            refused.append(str(exc))
    assert refused == []


@pytest.mark.parametrize("url", ["http://am:0", "http://am:99999", "http://[fd00::1]:0/", "http://am:9093/?x=1",
                                 "http://am:9093/#x", "https://hooks.shop/%zz", "http://am/\u00a0"])
def test_a_url_the_crd_refuses_is_refused_by_the_chart_and_the_operator(url):
    chart = re.compile(_re2_class_to_python(FORMATS["alertmanagerUrl"]["re"]))
    assert not chart.match(url)
    with pytest.raises(InvalidSpec, match=re.escape("spec.deadLetter.alertmanagerUrl=")):
        parse_spec({**GOOD, "deadLetter": {"alertmanagerUrl": url}})


def _with(key: str, value) -> dict:
    spec = json.loads(json.dumps(GOOD))
    if key == "minReplicas":
        spec["maxReplicas"] = 1000
    if key.startswith("deadLetter."):
        spec["deadLetter"] = {key.split(".", 1)[1]: value}
    else:
        spec[key] = value
    return spec


@pytest.mark.parametrize("key", sorted(policy.RANGES))
def test_an_integer_field_takes_its_whole_range_and_refuses_the_rest_naming_key_and_range(key):
    low, high = policy.RANGES[key]
    parse_spec(_with(key, low))
    parse_spec(_with(key, high))
    for bad in (None, str(low), low - 1, high + 1, low + 0.5, True):
        if bad is None and key == "maxOldestMessageAgeSeconds":
            continue  # optional: null is "no age limit", as the API server prunes it to absent
        with pytest.raises(InvalidSpec) as info:
            parse_spec(_with(key, bad))
        assert str(info.value) == f"spec.{key}={bad!r} is invalid: must be a whole number from {low} to {high}"


@pytest.mark.parametrize("at", sorted(policy.FIELDS))
def test_an_unknown_key_is_refused_naming_it_and_the_valid_ones(at):
    spec = json.loads(json.dumps(GOOD))
    node = spec
    for part in filter(None, at.split(".")):
        node = node.setdefault(part, {})
    node["typo"] = 1
    with pytest.raises(InvalidSpec) as info:
        parse_spec(spec)
    where = f"spec.{at}" if at else "spec"
    assert f"{where}.typo=1 is invalid" in str(info.value)
    assert f"{where}: {', '.join(policy.FIELDS[at])}" in str(info.value)
