"""Hypothesis strategies for chart values documents: a valid base with a few keys changed to values a
user might write, plausible or wrong (numbers where strings go, units Kubernetes does not know, names
with spaces, huge numbers, nulls). The chart must render them into manifests the API server accepts,
or refuse them naming a key it was given."""
from __future__ import annotations

import copy
from typing import Any

from hypothesis import strategies as st

BASE: dict[str, Any] = {
    "broker": {"existingSecret": {"name": "celery-broker"}},
    "workerPools": [{"name": "p", "app": "tasks", "queues": ["orders"]}],
}

finite_floats = st.floats(min_value=-1e12, max_value=1e12, allow_nan=False, allow_infinity=False)
small_text = st.text(max_size=12)
dns_label = st.from_regex(r"\A[a-z]([a-z0-9-]{0,20}[a-z0-9])?\Z")
seconds = st.one_of(st.integers(-5, 10**7), finite_floats, st.none(), small_text)
count = st.one_of(st.integers(-2, 10**10), finite_floats, small_text)
quantity = st.one_of(
    st.sampled_from(["100m", "1", "0.5", "2", "64Mi", "256Mi", "1Gi", "1.5Gi", "2G", "512mi", "512MB", "1 Gi", "", "-1"]),
    st.integers(-5, 10**12), finite_floats, small_text)
label_key = st.one_of(st.from_regex(r"\A([a-z]{1,8}(\.[a-z]{1,5})?/)?[a-z]([a-z0-9._-]{0,10}[a-z0-9])?\Z"), small_text)
label_value = st.one_of(st.from_regex(r"\A([a-z0-9]([a-z0-9._-]{0,12}[a-z0-9])?)?\Z"), st.text(max_size=70),
                        st.integers(), st.booleans())
labels = st.dictionaries(label_key, label_value, max_size=3)
queue = st.one_of(st.from_regex(r"\A[a-z][a-z0-9._-]{0,15}\Z"), small_text)
url = st.one_of(st.sampled_from(["", "http://am:9093", "https://hooks.example/x", "http://", "am:9093",
                                 "ftp://x", "http://a b"]), small_text)
image_tag = st.one_of(st.from_regex(r"\A[a-z0-9][a-z0-9._-]{0,10}\Z"), small_text, finite_floats, st.integers(0, 10**9))
repository = st.one_of(st.from_regex(r"\A[a-z0-9]+(/[a-z0-9]+){0,2}\Z"),
                       st.sampled_from(["worker:1.0", "My/Worker", "ghcr.io/acme/worker", "a b"]), small_text)
cidr = st.one_of(st.from_regex(r"\A(1?[0-9]{1,2}\.){3}1?[0-9]{1,2}/[0-9]{1,2}\Z"), small_text)
env_var = st.fixed_dictionaries({"name": st.one_of(st.from_regex(r"\A[A-Z][A-Z0-9_]{0,10}\Z"), small_text)},
                                optional={"value": st.one_of(small_text, st.integers(), st.booleans(), st.none())})
extra_arg = st.one_of(st.sampled_from(["--without-gossip", "--without-mingle", "-O", "fair", "--time-limit=9",
                                       "-c4", "--pool=solo", "--pool=prefork", "-B", "--prefetch-multiplier=4"]),
                      small_text)
pull_secret = st.one_of(dns_label, small_text, st.fixed_dictionaries({"name": st.one_of(dns_label, small_text)}))
max_unavailable = st.one_of(st.integers(-1, 5), st.sampled_from(["0%", "25%", "100%", "150%", "one"]))

#: key path -> what a user might write there
MUTATIONS: dict[tuple, st.SearchStrategy] = {
    ("workerPools", 0, "name"): st.one_of(dns_label, small_text,
                                          st.sampled_from(["operator", "exporter", "beat", "a" * 41])),
    ("workerPools", 0, "app"): st.one_of(st.sampled_from(["tasks", "proj.celery:app", "a b", ""]), small_text),
    ("workerPools", 0, "queues"): st.lists(queue, max_size=3),
    ("workerPools", 0, "deadLetterQueues"): st.lists(queue, max_size=3),
    ("workerPools", 0, "concurrency"): count,
    ("workerPools", 0, "logLevel"): st.sampled_from(["INFO", "info", "verbose", "WARNING", ""]),
    ("workerPools", 0, "extraArgs"): st.lists(extra_arg, max_size=3),
    ("workerPools", 0, "image", "tag"): image_tag,
    ("workerPools", 0, "image", "repository"): repository,
    ("workerPools", 0, "image", "registry"): st.sampled_from(["", "ghcr.io", "localhost:5000", "https://x"]),
    ("workerPools", 0, "imagePullSecrets"): st.lists(pull_secret, max_size=2),
    ("workerPools", 0, "timeLimits", "softSeconds"): seconds,
    ("workerPools", 0, "timeLimits", "hardSeconds"): seconds,
    ("workerPools", 0, "terminationGracePeriodSeconds"): seconds,
    ("workerPools", 0, "maxMemoryPerChildKb"): count,
    ("workerPools", 0, "maxTasksPerChild"): count,
    ("workerPools", 0, "heartbeatIntervalSeconds"): seconds,
    ("workerPools", 0, "resources"): st.fixed_dictionaries({}, optional={
        "requests": st.dictionaries(st.sampled_from(["cpu", "memory"]), quantity, max_size=2),
        "limits": st.dictionaries(st.sampled_from(["cpu", "memory"]), quantity, max_size=2)}),
    ("workerPools", 0, "scratchSizeLimit"): quantity,
    ("workerPools", 0, "env"): st.lists(env_var, max_size=2),
    ("workerPools", 0, "podLabels"): labels,
    ("workerPools", 0, "podAnnotations"): st.dictionaries(label_key, st.one_of(small_text, st.integers()), max_size=2),
    ("workerPools", 0, "nodeSelector"): labels,
    ("workerPools", 0, "replicas"): count,
    ("workerPools", 0, "autoscaling", "enabled"): st.booleans(),
    ("workerPools", 0, "autoscaling", "minReplicas"): count,
    ("workerPools", 0, "autoscaling", "maxReplicas"): count,
    ("workerPools", 0, "autoscaling", "deadLetter", "alertmanagerUrl"): url,
    ("workerPools", 0, "autoscaling", "deadLetter", "webhookUrl"): url,
    ("workerPools", 0, "autoscaling", "deadLetter", "threshold"): count,
    ("workerPools", 0, "autoscaling", "deadLetter", "resendIntervalSeconds"): seconds,
    ("workerPools", 0, "autoscaling", "deadLetter", "severity"): st.sampled_from(["critical", "page", "urgent", ""]),
    ("workerPools", 0, "podDisruptionBudget", "maxUnavailable"): max_unavailable,
    ("workerPools", 0, "serviceAccount", "create"): st.booleans(),
    ("workerPools", 0, "serviceAccount", "annotations"): st.dictionaries(label_key, small_text, max_size=2),
    ("workerPools", 0, "priorityClassName"): st.one_of(dns_label, small_text),
    ("broker", "type"): st.sampled_from(["redis", "rabbitmq", "sqs"]),
    ("broker", "ports"): st.lists(st.integers(-1, 70000), max_size=3),
    ("broker", "visibilityTimeoutSeconds"): seconds,
    ("broker", "existingSecret", "name"): st.one_of(dns_label, small_text),
    ("broker", "existingSecret", "key"): st.one_of(st.sampled_from(["url", "broker-url", "a/b", ""]), small_text),
    ("fullnameOverride",): st.one_of(dns_label, small_text, st.just("x" * 70)),
    ("commonLabels",): labels,
    ("commonAnnotations",): st.dictionaries(label_key, small_text, max_size=2),
    ("operator", "healthPort"): st.integers(0, 70000),
    ("operator", "metricsPort"): st.integers(0, 70000),
    ("operator", "image", "tag"): image_tag,
    ("operator", "defaultAlertmanagerUrl"): url,
    ("networkPolicy", "apiServer", "cidrs"): st.lists(cidr, max_size=2),
    ("networkPolicy", "enabled"): st.booleans(),
    ("beat", "enabled"): st.booleans(),
    ("beat", "maxIntervalSeconds"): count,
    ("monitoring", "podMonitor", "enabled"): st.booleans(),
    ("global", "imageRegistry"): st.sampled_from(["", "mirror.example:5000", "https://mirror"]),
}


def key_of(path: tuple) -> str:
    """A key path as the chart's messages write it: workerPools[0].image.tag."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def with_value(values: dict, path: tuple, value: Any) -> None:
    node = values
    for part in path[:-1]:
        node = node[part] if isinstance(part, int) else node.setdefault(part, {})
    node[path[-1]] = value


@st.composite
def values_documents(draw) -> tuple[dict, list[str]]:
    """(values, the keys that were changed)."""
    values = copy.deepcopy(BASE)
    paths = draw(st.lists(st.sampled_from(sorted(MUTATIONS, key=key_of)), min_size=1, max_size=4, unique=True))
    for path in paths:
        with_value(values, path, draw(MUTATIONS[path]))
    return values, [key_of(path) for path in paths]
