"""The corpus of bad values (corpus/bad-values.yaml): each document is refused before anything renders,
with a message naming the key as the user wrote it."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from chart_support import CRASHES, RULES_REFUSAL, SCHEMA_REFUSAL, helm, names_key, template_args

CORPUS_DIR = Path(__file__).parent / "corpus"
BASE = CORPUS_DIR / "base-values.yaml"
CORPUS = yaml.safe_load((CORPUS_DIR / "bad-values.yaml").read_text())


@pytest.fixture(scope="module")
def refusals(tmp_path_factory) -> dict[str, str]:
    """Every document rendered once (two at a time: helm is CPU-bound and the machine has two cores)."""
    tmp = tmp_path_factory.mktemp("bad-values")
    with ThreadPoolExecutor(max_workers=2) as pool:
        messages = pool.map(lambda case: _stderr(case, tmp), CORPUS)
        return dict(zip((c["name"] for c in CORPUS), messages))


def _stderr(case: dict, tmp: Path) -> str | None:
    values = tmp / f"{CORPUS.index(case)}.yaml"
    values.write_text(case["values"])
    result = helm(*template_args([BASE, values]), check=False)
    return None if result.returncode == 0 else result.stderr


def test_the_corpus_is_large_and_every_case_is_distinct():
    names = [c["name"] for c in CORPUS]
    assert len(names) >= 100
    assert len(set(names)) == len(names)
    assert len({c["values"] for c in CORPUS}) == len(CORPUS)


def test_the_base_values_render():
    result = helm(*template_args([BASE]), check=False)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("case", CORPUS, ids=[c["name"] for c in CORPUS])
def test_bad_values_are_refused_naming_the_key(case, refusals):
    message = refusals[case["name"]]
    assert message is not None, f"accepted:\n{case['values']}"
    assert SCHEMA_REFUSAL in message or RULES_REFUSAL in message, message
    assert not any(crash in message for crash in CRASHES), message
    assert names_key(message, case["key"]), f"the message does not name {case['key']}:\n{message}"
    if "says" in case:
        assert case["says"] in message, message


def test_a_value_from_the_defaults_is_reported_where_it_was_written(refusals):
    """The same mistake written in workerPoolDefaults and in a pool is reported at each place."""
    in_defaults = refusals["soft limit above the hard limit, both in the defaults"]
    assert "workerPoolDefaults.timeLimits.softSeconds=250" in in_defaults
    assert "workerPools[0]" not in in_defaults
    in_pool = refusals["soft limit equal to the hard limit"]
    assert "workerPools[0].timeLimits.softSeconds=300" in in_pool
    assert "workerPoolDefaults.timeLimits.hardSeconds=300" in in_pool


def test_every_problem_is_reported_at_once(tmp_path):
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({
        "broker": {"existingSecret": {"name": ""}, "visibilityTimeoutSeconds": 100},
        "workerPools": [
            {"name": "p", "app": "tasks", "timeLimits": {"softSeconds": 200, "hardSeconds": 150},
             "terminationGracePeriodSeconds": 60, "autoscaling": {"minReplicas": 5, "maxReplicas": 2}},
            {"name": "q", "app": "tasks", "queues": []},
        ]}))
    message = helm(*template_args([BASE, values]), check=False).stderr
    expected = [
        "broker.existingSecret.name is empty",
        "workerPools[0].timeLimits.softSeconds=200 must be less than workerPools[0].timeLimits.hardSeconds=150",
        "workerPools[0].terminationGracePeriodSeconds=60 is too short",
        "broker.visibilityTimeoutSeconds=100 must be greater than workerPools[0].timeLimits.hardSeconds=150",
        "workerPools[0].autoscaling.minReplicas=5 must not exceed workerPools[0].autoscaling.maxReplicas=2",
        "broker.visibilityTimeoutSeconds=100 must be greater than workerPoolDefaults.timeLimits.hardSeconds=300",
        "workerPools[1].queues is empty",
    ]
    for line in expected:
        assert line in message
    assert f"{len(expected)} problem(s)" in message
