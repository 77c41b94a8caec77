"""`taskherd exporter` scraped over HTTP against real queues with known contents, both brokers."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from urllib.parse import urlsplit, urlunsplit

import httpx
from celery import Celery
from kombu import Connection, Exchange, Queue
from prometheus_client.parser import text_string_to_metric_families

from e2e.lib.services import free_port
from e2e.lib.waiting import wait_for
from taskherd.commands.exporter import Snapshot, metric_families
from taskherd.queues import QueueStats
from taskherd.queues.publish_history import STATS_LAG_SECONDS
from taskherd.worker.components import publish_stamps


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_exporter_serves_queue_figures(broker_url, rabbitmq_api_url, unique_name, tmp_path):
    queue, dlq = unique_name, unique_name + ".dlq"
    amqp = broker_url.startswith("amqp")
    app = Celery(broker=broker_url)
    app.conf.task_queues = [Queue(queue, Exchange(queue), routing_key=queue), Queue(dlq, routing_key=dlq)]
    publish_stamps.connect()
    try:
        before = time.time()
        for priority in (0, 0, 6):
            app.send_task("t.x", queue=queue, priority=priority)
        for _ in range(2):
            app.send_task("t.dead", queue=dlq)
    finally:
        publish_stamps.disconnect()
    app.close()
    port = free_port()
    # the workers' Secret, which the chart gives the exporter too, as a failover list whose first
    # broker is down (nothing listens on port 1): kombu connects to the next, and so does the exporter
    parts = urlsplit(broker_url)
    down = urlunsplit(parts._replace(netloc=parts.netloc.rpartition(":")[0] + ":1"))
    env = {**os.environ, "TASKHERD_BROKER_URL": f"{down};{broker_url}", "TASKHERD_QUEUES": queue}
    command = [sys.executable, "-m", "taskherd.cli", "exporter", "--port", str(port), "--address", "127.0.0.1",
               "--interval", "1"] + (["--management-url", rabbitmq_api_url] if amqp else [])
    log = open(tmp_path / "exporter.log", "wb")
    exporter = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    holder = Connection(broker_url)
    try:
        # One delivery held unacknowledged while we scrape.
        held = holder.default_channel.basic_get(queue, no_ack=False)
        assert held is not None
        q = (("queue", queue),)
        wanted = [("taskherd_queue_messages", q + (("state", "ready"),)),
                  ("taskherd_queue_messages", q + (("state", "unacked"),)),
                  ("taskherd_dlq_messages", (("dlq", dlq), ("queue", queue)))]
        age_key = ("taskherd_queue_oldest_message_age_seconds", q)

        def served():
            figures = scrape(port)
            return [figures.get(key) for key in wanted] + [age_key in figures]

        # RabbitMQ reports the head's timestamp a stats interval after the counts
        wait_for("the exporter serving ready 2, unacked 1, dead letters 2 and an age", served,
                 equals=[2, 1, 2, True], ignoring=(httpx.HTTPError,), timeout=45, interval=0.5)
        figures = scrape(port)
        age = figures[("taskherd_queue_oldest_message_age_seconds", q)]
        # RabbitMQ: until the head timestamp is in the statistics, the age is the midpoint of the
        # publish-counter bracket, which may be older than the truth by up to half its width.
        slack = STATS_LAG_SECONDS if amqp else 0.0
        assert 0 <= age <= time.time() - before + 1.5 + slack
        assert figures[("taskherd_exporter_poll_success", ())] == 1
        if amqp:
            assert figures[("taskherd_queue_consumers", q)] == 0
        else:
            assert figures[("taskherd_queue_visibility_timeout_seconds", q)] == 3600
            assert 0 <= figures[("taskherd_queue_oldest_unacked_age_seconds", q)] < 60
    finally:
        holder.release()
        exporter.terminate()
        exporter.wait(timeout=10)
        log.close()
    logged = (tmp_path / "exporter.log").read_text()
    assert exporter.returncode == 0, logged
    # httpx logs every management API request at INFO: two lines a queue a poll, kept to warnings
    assert "HTTP Request:" not in logged, logged[-2000:]


def test_a_failed_poll_exports_no_stale_queue_figures():
    stats = {"q": QueueStats("q", 3, 1, None, 5.0, 2.0, 3600.0), "q.dlq": QueueStats("q.dlq", 7, 0, None, None, None)}
    ok = {m.name: m.samples for m in metric_families(Snapshot(stats, True, 100.0, 0.1), {"q": "q.dlq"})}
    assert [s.value for s in ok["taskherd_queue_messages"]] == [3, 1]
    assert ok["taskherd_dlq_messages"][0].value == 7 and ok["taskherd_dlq_messages"][0].labels["dlq"] == "q.dlq"
    failed = {m.name: m.samples for m in metric_families(Snapshot(stats, False, 200.0, 0.1), {"q": "q.dlq"})}
    assert failed["taskherd_queue_messages"] == [] and failed["taskherd_exporter_poll_success"][0].value == 0


def test_exporter_refuses_missing_settings():
    result = subprocess.run([sys.executable, "-m", "taskherd.cli", "exporter", "-Q", "q"],
                            env={k: v for k, v in os.environ.items() if k != "TASKHERD_BROKER_URL"},
                            capture_output=True, text=True, timeout=30)
    assert result.returncode != 0 and "-b/--broker is required" in result.stderr


def test_a_lower_bound_age_says_so_and_a_queue_the_broker_has_not_reported_exports_nothing():
    from taskherd.queues.stats import AGE_LOWER_BOUND

    stats = {"q": QueueStats("q", ready=5, unacked=0, consumers=0, oldest_age_seconds=600.0,
                             oldest_unacked_age_seconds=None, oldest_age_method=AGE_LOWER_BOUND),
             "q.dlq": QueueStats("q.dlq", ready=0, unacked=0, consumers=0, oldest_age_seconds=None,
                                 oldest_unacked_age_seconds=None, pending=True),
             "r": QueueStats("r", ready=0, unacked=0, consumers=0, oldest_age_seconds=None,
                             oldest_unacked_age_seconds=None, pending=True)}
    families = {m.name: m.samples for m in metric_families(Snapshot(stats, True, 1.0, 0.1),
                                                           {"q": "q.dlq", "r": "r.dlq"})}
    assert [(s.labels["queue"], s.value) for s in families["taskherd_queue_oldest_message_age_is_lower_bound"]] == \
        [("q", 1.0)]
    assert {s.labels["queue"] for s in families["taskherd_queue_messages"]} == {"q"}, "pending queues: no zeros"
    assert families["taskherd_dlq_messages"] == []
