"""The HTTP probe endpoints: the exec probe's verdicts, over a real HTTP server, on a real heartbeat file."""
import json
import time
import urllib.error
import urllib.request

import pytest

from taskherd.pod import probe
from taskherd.worker.components.probes import ProbeEndpoints, answer, options, serve

NOW = 1_000_000.0


def record(**overrides):
    base = {"format": 1, "written_at": NOW - 1, "interval_seconds": 5.0, "pid": 42, "started_at": NOW - 100,
            "broker": {"state": "connected", "since": NOW - 90}, "draining_since": None, "active": []}
    return {**base, **overrides}


@pytest.mark.parametrize("kind", probe.KINDS)
@pytest.mark.parametrize("case", [record(), record(written_at=NOW - 31), record(broker={"state": "disconnected",
                                                                                        "since": NOW - 12}),
                                  record(active=[{"id": "a", "name": "t", "started_at": NOW - 200, "time_limit": 100}]),
                                  record(format=7), record(broker="down"), None])
def test_http_answers_what_the_exec_probe_decides(kind, case):
    verdict = probe.judge(kind, case, now=NOW)
    status, body = answer(kind, case, now=NOW)
    assert status == (200 if verdict.ok else 503)
    assert body == f"{kind} {'ok' if verdict.ok else 'failed'}: {verdict.reason}\n"


def test_query_parameters_are_the_exec_flags_and_bad_ones_are_named():
    assert options("max-age=3&task-margin=0") == {"max_age": 3.0, "task_margin": 0.0}
    with pytest.raises(ValueError, match="parameter max-age='-1' must be a positive"):
        options("max-age=-1")
    with pytest.raises(ValueError, match="unknown parameter 'maxage' \\(valid: max-age, task-margin\\)"):
        options("maxage=3")


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@pytest.fixture
def server(tmp_path):
    path = tmp_path / "heartbeat.json"

    def metrics_app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"metrics here\n"]

    httpd = serve(ProbeEndpoints(metrics_app, heartbeat_path=str(path)), port=0, address="127.0.0.1")
    yield path, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def write(path, **fields):
    now = time.time()
    base = {"format": 1, "written_at": now, "interval_seconds": 5.0, "pid": 1, "started_at": now - 10,
            "broker": {"state": "connected", "since": now - 9}, "draining_since": None, "active": []}
    path.write_text(json.dumps({**base, **fields}))


def test_probe_paths_over_http_and_metrics_passed_through(server):
    path, base = server
    assert get(f"{base}/startupz") == (503, "startup failed: no heartbeat file: the worker has not started "
                                            "(or its heartbeat is not installed)\n")
    write(path)
    for route in ("livez", "readyz", "startupz"):
        status, body = get(f"{base}/{route}")
        assert status == 200, body
    assert get(f"{base}/metrics") == (200, "metrics here\n")

    write(path, broker={"state": "disconnected", "since": time.time() - 12})
    assert get(f"{base}/livez")[0] == 200, "a broker outage must not fail liveness"
    status, body = get(f"{base}/readyz")
    assert status == 503 and body.startswith("readiness failed: broker disconnected for 1")

    write(path, written_at=time.time() - 4)
    assert get(f"{base}/livez")[0] == 200
    status, body = get(f"{base}/livez?max-age=3")
    assert status == 503 and "the worker's main loop is not running" in body
    assert get(f"{base}/livez?max-age=zero") == (400, "liveness: parameter max-age='zero' is not a number of seconds "
                                                      "(valid: a number of seconds > 0 and <= 604800 (a week))\n")

    path.write_text("{not json")
    status, body = get(f"{base}/livez")
    assert status == 503 and body.startswith("liveness failed: cannot read heartbeat:")


def test_a_real_worker_answers_its_probes_over_http(private_redis, unique_name, worker_factory, tmp_path):
    """The kubelet's view: ready and alive; a broker outage fails readiness only; a stopped worker
    does not answer at all (a probe timeout is a failure)."""
    import signal
    import socket

    from e2e.lib.services import free_port
    from e2e.lib.waiting import wait_for

    port = free_port()
    env = {"TEST_BROKER_URL": f"{private_redis.url}/1", "TEST_LEDGER_URL": f"{private_redis.url}/2",
           "TEST_QUEUE": unique_name, "TASKHERD_HEARTBEAT_DIR": str(tmp_path / "hb"),
           "TASKHERD_HEARTBEAT_INTERVAL": "0.5", "TEST_METRICS_PORT": str(port)}
    worker = worker_factory("apps.runtime_app", queues=[unique_name], env=env, concurrency=1)
    base = f"http://127.0.0.1:{port}"
    for route in ("startupz", "readyz", "livez"):
        wait_for(f"/{route} answering 200", lambda: get(f"{base}/{route}")[0] == 200, timeout=15,
                 ignoring=(OSError,))
    status, body = get(f"{base}/metrics")
    assert status == 200 and "taskherd_heartbeat_timestamp_seconds" in body, "the same server still serves /metrics"

    private_redis.stop()
    status, body = wait_for("readiness failing during the broker outage", lambda: get(f"{base}/readyz"),
                            timeout=20, until=lambda response: response[0] == 503)
    assert body.startswith("readiness failed: broker disconnected")
    assert get(f"{base}/livez")[0] == 200, "a broker outage must not fail liveness"
    private_redis.start()
    wait_for("ready again once the broker is back", lambda: get(f"{base}/readyz")[0] == 200, timeout=30)

    worker.signal(signal.SIGSTOP)
    try:
        with pytest.raises((socket.timeout, urllib.error.URLError, TimeoutError)):
            urllib.request.urlopen(f"{base}/livez", timeout=2).read()
    finally:
        worker.signal(signal.SIGCONT)
    wait_for("alive again after SIGCONT", lambda: get(f"{base}/livez")[0] == 200, timeout=15)
