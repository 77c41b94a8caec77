"""Celery beat as the chart runs it: a real `celery beat` process of an app that calls configure()
sends its periodic task to the pool's queue, writes a heartbeat from its schedule loop, and the
probe the chart's liveness runs (`taskherd probe liveness --max-age`) fails once the loop stops."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import redis

from support.waiting import wait_until

APPS = Path(__file__).parent / "apps"
MAX_INTERVAL = 1
MAX_AGE = 4


def probe(kind: str, heartbeat_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "taskherd.cli", "probe", kind, "--dir", str(heartbeat_dir),
                           "--max-age", str(MAX_AGE)], capture_output=True, text=True, timeout=30)


def test_beat_sends_to_the_pools_queue_and_its_loop_keeps_the_heartbeat(redis_url, unique_name, worker_factory,
                                                                        tmp_path):
    heartbeat_dir = tmp_path / "beat-heartbeat"
    env = {"TASKHERD_BROKER_URL": redis_url, "TASKHERD_QUEUES": unique_name, "TEST_LEDGER_URL": redis_url,
           "TASKHERD_HEARTBEAT_DIR": str(heartbeat_dir), "POD_NAME": "beat-a", "PYTHONPATH": str(APPS)}
    worker_factory("chart_app", queues=[unique_name], env={k: v for k, v in env.items() if k != "TASKHERD_HEARTBEAT_DIR"})
    log = open(tmp_path / "beat.log", "wb")
    beat = subprocess.Popen([sys.executable, "-m", "celery", "-A", "chart_app", "beat", "--loglevel=INFO",
                             f"--schedule={tmp_path / 'schedule'}", f"--max-interval={MAX_INTERVAL}"],
                            env={**os.environ, **env}, cwd=APPS, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    ledger = redis.Redis.from_url(redis_url)
    try:
        wait_until(lambda: probe("startup", heartbeat_dir).returncode == 0, timeout=60, what="beat's first heartbeat",
                   explain=lambda: (tmp_path / "beat.log").read_text())
        # The periodic task reaches a worker of the pool's queue (configure() made it the default queue).
        wait_until(lambda: ledger.zcard("ticks:beat-a") >= 3, timeout=60, what="3 ticks from beat-a run by the worker")
        assert probe("liveness", heartbeat_dir).returncode == 0

        os.kill(beat.pid, signal.SIGSTOP)  # the loop stops; nothing else changes
        time.sleep(MAX_AGE + 2)
        stale = probe("liveness", heartbeat_dir)
        assert stale.returncode == 1, stale.stdout
        assert "heartbeat is" in stale.stdout and f"(limit {MAX_AGE}s)" in stale.stdout

        os.kill(beat.pid, signal.SIGCONT)
        wait_until(lambda: probe("liveness", heartbeat_dir).returncode == 0, timeout=30, what="beat alive again")
    finally:
        os.kill(beat.pid, signal.SIGCONT)
        beat.kill()
        beat.wait(timeout=30)
        log.close()
