"""scripts/run_tests.py: how `make test` splits the suite into the cluster tests and the others."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("run_tests", Path(__file__).parents[2] / "scripts" / "run_tests.py")
run_tests = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run_tests)


@pytest.mark.parametrize("args,cluster,others", [
    ([], ["-m", "cluster"], ["-m", "not cluster"]),
    # kind.mk's deselection, as make passes it: kept in both halves
    (["-m", "not kind and not networkpolicy", "-q"],
     ["-q", "-m", "(not kind and not networkpolicy) and cluster"],
     ["-q", "-m", "(not kind and not networkpolicy) and not cluster"]),
    # pytest keeps the last -m; written glued too
    (["-mslow", "tests/worker", "-m", "not slow"],
     ["tests/worker", "-m", "(not slow) and cluster"], ["tests/worker", "-m", "(not slow) and not cluster"]),
    (["--maxfail=1", "-k", "drain"], ["--maxfail=1", "-k", "drain", "-m", "cluster"],
     ["--maxfail=1", "-k", "drain", "-m", "not cluster"]),
])
def test_each_half_keeps_the_users_arguments_and_marker_expression(args, cluster, others):
    assert run_tests.halves(args) == (cluster, others)


@pytest.mark.parametrize("cluster,others,status", [
    (0, 0, 0),
    (1, 0, 1), (0, 1, 1), (2, 0, 2),
    # a PYTEST_ARGS naming one file leaves one half without tests: not a failure…
    (5, 0, 0), (0, 5, 0), (5, 1, 1),
    # …unless neither half has one (pytest's exit 5 is a failure of `make test`)
    (5, 5, 5),
])
def test_the_run_fails_when_either_half_fails_or_neither_ran_a_test(cluster, others, status):
    assert run_tests.combined_status(cluster, others) == status
