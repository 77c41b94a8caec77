"""`taskherd exporter` when the broker answers with an error, for one queue or for all of them.

Whatever fails while inspecting is a failed poll: one log line naming the queue and the broker's
own error, `taskherd_exporter_poll_success` 0, and the exporter keeps serving and recovers by
itself. One bad queue among good ones fails alone: the others' figures are still exported, the bad
one's series are absent and `taskherd_exporter_queue_poll_success{queue}` is 0 for it.
Real Redis and RabbitMQ, and a real `taskherd exporter` process.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote, urlsplit

import httpx
import pytest
import redis
from kombu import Connection

from e2e.lib.services import free_port
from e2e.lib.waiting import wait_for
from prometheus_client.parser import text_string_to_metric_families

MESSAGE = json.dumps({"body": "", "headers": {"taskherd_published_at": 0}, "properties": {}})


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


class Exporter:
    def __init__(self, broker: str, queues: list[str], log_path: Path, extra: list[str] = ()) -> None:
        self.port = free_port()
        self.log_path = log_path
        env = {**os.environ, "TASKHERD_BROKER_URL": broker, "TASKHERD_QUEUES": ",".join(queues)}
        self._log = open(log_path, "wb")
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "taskherd.cli", "exporter", "--port", str(self.port), "--address", "127.0.0.1",
             "--interval", "1", *extra], env=env, stdout=self._log, stderr=subprocess.STDOUT)

    def figures(self) -> dict[tuple[str, tuple], float]:
        if self.process.poll() is not None:
            raise AssertionError(f"the exporter ended (exit {self.process.returncode}):\n{self.log()[-3000:]}")
        return scrape(self.port)

    def wait(self, what: str, until, timeout: float = 30) -> dict:
        return wait_for(what, self.figures, until=until, ignoring=(httpx.HTTPError,), timeout=timeout, interval=0.3,
                        explain=lambda: self.log()[-3000:])

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        return self.process.returncode


@contextlib.contextmanager
def exporter(broker: str, queues: list[str], tmp_path: Path, extra: list[str] = ()):
    running = Exporter(broker, queues, tmp_path / f"exporter-{time.monotonic_ns()}.log", list(extra))
    try:
        yield running
    finally:
        code = running.stop()
    assert code == 0, running.log()[-3000:]


def ready(queue: str) -> tuple[str, tuple]:
    return ("taskherd_queue_messages", (("queue", queue), ("state", "ready")))


def queue_ok(queue: str) -> tuple[str, tuple]:
    return ("taskherd_exporter_queue_poll_success", (("queue", queue),))


POLL_OK = ("taskherd_exporter_poll_success", ())


def series_of(figures: dict, queue: str) -> list:
    """The queue figures exported for `queue` (its poll-success gauge left out)."""
    return [key for key in figures if key[0].startswith("taskherd_queue_") and ("queue", queue) in key[1]]


def test_a_queue_key_of_the_wrong_type_fails_that_queue_alone_at_start_and_while_running(redis_url, unique_name,
                                                                                         tmp_path):
    good, bad, later = f"{unique_name}.good", f"{unique_name}.bad", f"{unique_name}.later"
    client = redis.Redis.from_url(redis_url)
    client.lpush(good, MESSAGE)
    client.set(bad, "oops")  # what `redis-cli set <queue> oops` leaves: a string where kombu keeps a list
    with exporter(redis_url, [good, bad, later], tmp_path) as running:
        figures = running.wait("the good queue exported, the bad one failed", lambda f: f.get(ready(good)) == 1)
        assert figures[POLL_OK] == 0 and figures[queue_ok(bad)] == 0 and figures[queue_ok(good)] == 1
        assert series_of(figures, bad) == [], "a queue not read exports no figures (stale ones look healthy)"
        log = running.log()
        assert f"poll failed for queue {bad!r}" in log and f"key {bad!r} holds a string, not a list" in log, log
        assert "WRONGTYPE" in log and "Traceback" not in log, log

        # the cause goes: the exporter recovers by itself
        client.delete(bad)
        client.lpush(bad, MESSAGE, MESSAGE)
        figures = running.wait("recovered", lambda f: f.get(POLL_OK) == 1 and f.get(ready(bad)) == 2)
        assert figures[queue_ok(bad)] == 1 and figures[ready(good)] == 1

        # a key of the wrong type while running (a hash this time)
        client.hset(later, "field", "value")
        figures = running.wait("the later queue failed", lambda f: f.get(queue_ok(later)) == 0)
        assert figures[POLL_OK] == 0 and figures[ready(good)] == 1 and figures[ready(bad)] == 2
        assert series_of(figures, later) == []
        assert f"key {later!r} holds a hash, not a list" in running.log()
        client.delete(later)
        running.wait("recovered again", lambda f: f.get(POLL_OK) == 1 and f.get(ready(later)) == 0)
        assert running.process.poll() is None


def test_a_reply_error_of_no_one_queue_fails_the_whole_poll_and_the_exporter_keeps_serving(redis_url, unique_name,
                                                                                          tmp_path):
    queue = unique_name
    client = redis.Redis.from_url(redis_url)
    client.lpush(queue, MESSAGE)
    client.set("unacked", "oops")  # kombu's hash of unacknowledged deliveries: every queue's figure
    with exporter(redis_url, [queue], tmp_path) as running:
        figures = running.wait("a failed poll served", lambda f: POLL_OK in f)
        assert figures[POLL_OK] == 0 and figures[queue_ok(queue)] == 0 and series_of(figures, queue) == []
        log = running.log()
        assert f"poll failed (queues {queue!r}, {queue + '.dlq'!r})" in log, log
        assert "key 'unacked' holds a string, not a hash" in log, log
        client.delete("unacked")
        running.wait("recovered", lambda f: f.get(POLL_OK) == 1 and f.get(ready(queue)) == 1)
        assert "poll succeeded again" in running.log()


@pytest.fixture
def own_redis(tmp_path):
    """A redis-server of this test's own (its ACL users changed freely), stopped by its PID."""
    server = shutil.which("redis-server")
    assert server, "redis-server is not installed (scripts/services.sh up installs it)"
    port = free_port()
    process = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                "--appendonly", "no", "--dir", str(tmp_path)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = redis.Redis(port=port)
        wait_for("our redis-server answering", client.ping, timeout=10, ignoring=(redis.ConnectionError,))
        yield port, client
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_an_acl_refusing_one_queue_fails_that_queue_alone(own_redis, tmp_path):
    from taskherd.queues import QueuesUnreadable, inspect_queues

    port, admin = own_redis
    admin.lpush("shop", MESSAGE)
    admin.lpush("secret", MESSAGE)
    # no scripting (a managed Redis), and keys of `secret` not readable by this user
    admin.execute_command("ACL", "SETUSER", "limited", "on", ">pw", "~shop*", "~unacked*", "~_kombu.*",
                          "+@all", "-@scripting")
    url = f"redis://limited:pw@127.0.0.1:{port}/0"
    with pytest.raises(QueuesUnreadable) as refused:
        inspect_queues(url, ["shop", "secret"])
    assert list(refused.value.errors) == ["secret"] and "NoPermissionError" in refused.value.errors["secret"]
    assert refused.value.stats["shop"].ready == 1, "the queue the user may read keeps its figures"
    assert "pw" not in str(refused.value) and "limited:***@" in str(refused.value)

    with exporter(url, ["shop", "secret"], tmp_path) as running:
        figures = running.wait("shop exported, secret failed", lambda f: f.get(ready("shop")) == 1)
        assert figures[queue_ok("secret")] == 0 and figures[POLL_OK] == 0
        assert "poll failed for queue 'secret'" in running.log() and ":pw@" not in running.log()


def test_a_failover_list_is_polled_from_the_url_that_answered_last(redis_url, unique_name, tmp_path):
    """The first URL accepts connections but never answers: only the first poll pays the client's
    socket timeout (10 s), not every poll."""
    queue = unique_name
    redis.Redis.from_url(redis_url).lpush(queue, MESSAGE)
    with socket.socket() as hanging:
        hanging.bind(("127.0.0.1", 0))
        hanging.listen(64)  # never accepted, never read: connections complete, requests go unanswered
        hang_url = f"redis://127.0.0.1:{hanging.getsockname()[1]}/0"
        with exporter(f"{hang_url};{redis_url}", [queue], tmp_path) as running:
            first = running.wait("the first poll served", lambda f: f.get(POLL_OK) == 1, timeout=40)
            assert time.monotonic() - running.started >= 9, "the first URL did not hang: the test proves nothing"
            assert first[ready(queue)] == 1
            started = first[("taskherd_exporter_last_poll_timestamp_seconds", ())]
            figures = running.wait(
                "a later poll", lambda f: f[("taskherd_exporter_last_poll_timestamp_seconds", ())] > started + 1.5,
                timeout=40)
            assert figures[POLL_OK] == 1 and figures[ready(queue)] == 1
            assert figures[("taskherd_exporter_poll_duration_seconds", ())] < 2, figures


class ManagementProxy:
    """Forwards to the real RabbitMQ management API, except what a test makes it answer itself:
    `per_queue[name] = (status, body)` for that queue's document, or `everything = (status, body)`."""

    def __init__(self, api_url: str) -> None:
        api = urlsplit(api_url)
        self.upstream = f"{api.scheme}://{api.hostname}:{api.port}"
        self.per_queue: dict[str, tuple[int, bytes]] = {}
        self.everything: tuple[int, bytes] | None = None
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                answer = proxy.everything
                for name, canned in proxy.per_queue.items():
                    if self.path.split("?")[0].endswith("/" + quote(name, safe="")):
                        answer = answer or canned
                if answer is None:
                    upstream = httpx.get(proxy.upstream + self.path, timeout=10,
                                         headers={"Authorization": self.headers.get("Authorization", "")})
                    answer = (upstream.status_code, upstream.content)
                self.send_response(answer[0])
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer[1])))
                self.end_headers()
                self.wfile.write(answer[1])

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://{api.username}:{api.password}@127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_management_api_errors_fail_their_queue_or_the_poll_and_the_exporter_keeps_serving(amqp_url,
                                                                                           rabbitmq_api_url,
                                                                                           unique_name, tmp_path):
    good, broken, garbled = f"{unique_name}.good", f"{unique_name}.500", f"{unique_name}.json"
    with Connection(amqp_url) as connection:
        channel = connection.default_channel
        for name in (good, broken, garbled):
            channel.queue_declare(name, durable=True, auto_delete=False)
        channel.basic_publish(channel.prepare_message(b"x", content_type="text/plain", content_encoding="binary"),
                              exchange="", routing_key=good)
    proxy = ManagementProxy(rabbitmq_api_url)
    proxy.per_queue = {broken: (500, b'{"error":"Internal Server Error","reason":"boom"}'),
                       garbled: (200, b"<html>not json")}
    try:
        with exporter(amqp_url, [good, broken, garbled], tmp_path, ["--management-url", proxy.url]) as running:
            figures = running.wait("the good queue exported", lambda f: f.get(ready(good)) == 1, timeout=45)
            assert figures[POLL_OK] == 0 and figures[queue_ok(broken)] == 0 and figures[queue_ok(garbled)] == 0
            assert series_of(figures, broken) == [] and series_of(figures, garbled) == []
            log = running.log()
            assert f"poll failed for queue {broken!r}" in log and "HTTP 500" in log and "boom" in log, log
            assert f"poll failed for queue {garbled!r}" in log and "not the JSON expected" in log, log
            password = urlsplit(proxy.url).password
            assert f":{password}@" not in log, "the password is redacted"

            # the API refuses the exporter whole (a rotated password): the whole poll fails
            proxy.everything = (401, b'{"error":"not_authorised","reason":"Login failed"}')
            figures = running.wait("a refused poll", lambda f: f.get(queue_ok(good)) == 0)
            assert figures[POLL_OK] == 0 and series_of(figures, good) == []
            assert "HTTP 401" in running.log()

            proxy.everything, proxy.per_queue = None, {}
            figures = running.wait("recovered", lambda f: f.get(POLL_OK) == 1, timeout=45)
            assert figures[ready(good)] == 1 and figures[queue_ok(broken)] == 1
    finally:
        proxy.close()
