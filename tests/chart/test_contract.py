"""The chart and the programs agree on one contract (taskherd.contract): every TASKHERD_* variable the
chart sets is declared for that container, every declared one is set by some scenario, and every
rendered value parses as its reader will parse it."""
from __future__ import annotations

import subprocess
import sys

import pytest

from chart_support import CHART, CI_VALUES, render
from taskherd import contract

#: container name in the chart -> contract container
CONTAINERS = {"taskherd-worker": "worker", "taskherd-exporter": "exporter", "taskherd-operator": "operator",
              "taskherd-beat": "beat", "taskherd-test": "test"}


def _containers(objects: list[dict]):
    for obj in objects:
        if obj["kind"] == "Deployment":
            pod = obj["spec"]["template"]["spec"]
        elif obj["kind"] == "Pod":
            pod = obj["spec"]
        else:
            continue
        for container in pod["containers"]:
            yield obj["metadata"]["name"], container


def _rendered_variables() -> dict[str, dict[str, list[dict]]]:
    """contract container -> variable name -> every rendered EnvVar of it, over all scenarios."""
    seen: dict[str, dict[str, list[dict]]] = {kind: {} for kind in CONTAINERS.values()}
    for scenario in CI_VALUES:
        for _, container in _containers(render([scenario])):
            kind = CONTAINERS.get(container["name"])
            if kind is None and container["name"].startswith("sidecar-"):
                continue  # the user's own containers (ci/features-values.yaml)
            assert kind is not None, f"{scenario.name}: container {container['name']!r} is not mapped to the contract"
            for env in container.get("env") or []:
                if env["name"].startswith("TASKHERD_"):
                    seen[kind].setdefault(env["name"], []).append(env)
    return seen


RENDERED = None


def rendered():
    global RENDERED
    if RENDERED is None:
        RENDERED = _rendered_variables()
    return RENDERED


@pytest.mark.parametrize("kind", sorted(set(CONTAINERS.values())))
def test_the_chart_sets_exactly_the_variables_the_contract_declares(kind):
    set_by_chart = set(rendered()[kind])
    declared = contract.set_by_chart(kind)
    assert set_by_chart - declared == set(), f"the chart sets undeclared variables on the {kind}: nobody reads them"
    assert declared - set_by_chart == set(), f"declared for the {kind} but set by no ci/ scenario of the chart"


def test_every_rendered_value_parses_as_its_reader_parses_it():
    checked = 0
    for kind, variables in rendered().items():
        for name, envs in variables.items():
            for env in envs:
                if "valueFrom" in env:
                    continue  # a Secret's value is the user's, checked where it is read
                values, problems = contract.read((name,), {name: env["value"]})
                assert not problems, f"{kind}: {problems}"
                checked += 1
    assert checked > 20


def test_a_custom_dead_letter_queue_reaches_the_worker_and_the_exporter():
    objects = render([CI_VALUES[0]], values={
        "broker": {"existingSecret": {"name": "b"}},
        "workerPools": [{"name": "p", "app": "a.app", "queues": ["orders", "mail"],
                         "deadLetterQueues": ["orders-failed", "mail-failed"]}]})
    env = {kind: {e["name"]: e.get("value") for e in c.get("env") or []}
           for kind, c in ((CONTAINERS[c["name"]], c) for _, c in _containers(objects))}
    assert env["worker"]["TASKHERD_DEAD_LETTER_QUEUES"] == "orders-failed,mail-failed"
    assert env["exporter"]["TASKHERD_QUEUES"] == "orders,mail"
    assert env["exporter"]["TASKHERD_DEAD_LETTER_QUEUES"] == "orders-failed,mail-failed"


def test_the_contract_table_in_docs_is_generated_and_current():
    result = subprocess.run([sys.executable, str(CHART / "hack" / "gen-contract-table.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
