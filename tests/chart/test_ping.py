"""`taskherd ping`, which the chart's `helm test` pod runs: a real worker on each broker answers through
the broker; without a worker the command fails within its timeout, saying why."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

APPS = Path(__file__).parent / "apps"


def taskherd(*args: str, env: dict[str, str], timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "taskherd.cli", *args], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=timeout, cwd=APPS)


@pytest.fixture
def pool_env(broker_url, redis_url, unique_name, tmp_path) -> dict[str, str]:
    """The environment the chart gives a pool's pods (and its test pod), here on loopback."""
    return {"TASKHERD_BROKER_URL": broker_url, "TASKHERD_QUEUES": unique_name, "TEST_LEDGER_URL": redis_url,
            "TASKHERD_DELIVERY_COUNTER_URL": redis_url, "PYTHONPATH": str(APPS)}


@pytest.mark.parametrize("with_app", [False, True], ids=["from-environment", "with-app"])
def test_a_worker_of_the_queue_answers(pool_env, worker_factory, unique_name, with_app):
    worker = worker_factory("chart_app", queues=[unique_name], env=pool_env)
    args = ["ping", "--timeout", "60"] + (["-A", "chart_app"] if with_app else [])
    result = taskherd(*args, env=pool_env)
    assert result.returncode == 0, result.stderr
    assert f"through queue '{unique_name}'" in result.stdout
    # The answer names the worker that ran it (its Celery node name).
    assert worker.hostname.split("@")[0] in result.stdout


def test_without_a_worker_it_fails_in_time_saying_why(pool_env, unique_name):
    started = time.monotonic()
    result = taskherd("ping", "--timeout", "3", env=pool_env)
    assert result.returncode == 1
    assert time.monotonic() - started < 30
    assert f"no worker of queue '{unique_name}' ran the ping within 3s" in result.stderr


def test_usage_errors_name_the_flag(pool_env):
    env = {k: v for k, v in pool_env.items() if k != "TASKHERD_QUEUES"}
    result = taskherd("ping", env=env)
    assert result.returncode == 2
    assert "-Q/--queues" in result.stderr
