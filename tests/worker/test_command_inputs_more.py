"""Bad input to `taskherd drain|probe|dlq|ping` is refused when the command line is read: exit 2, one
line naming the flag as written and its valid range, no traceback, nothing written or changed."""
import base64
import io
import json
import os
import subprocess
import sys
import time

import pytest

from taskherd import contract
from taskherd.commands import options
from taskherd.pod import flags, shared_files

TASKHERD = [sys.executable, "-m", "taskherd.cli"]
#: nothing listens on port 1 of loopback: anything that reached the broker would fail with exit 1
UNREACHABLE_AMQP = "amqp://guest:guest@127.0.0.1:1//"
UNREACHABLE_REDIS = "redis://127.0.0.1:1/0"


def taskherd(*argv, env=None, cwd=None):
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TASKHERD_")}
    return subprocess.run([*TASKHERD, *argv], capture_output=True, text=True, timeout=60, cwd=cwd,
                          env={**environ, **(env or {})})


def usage_error(result, says):
    assert (result.returncode, "Traceback" in result.stderr) == (2, False), result.stderr
    assert says in result.stderr, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if says in line]
    return line


# --- D8: every seconds flag of the pod commands has a maximum --------------------------------------

def _live_heartbeat(directory) -> None:
    shared_files.write_json_atomically(shared_files.heartbeat_path(str(directory)),
                                       {"format": shared_files.FORMAT, "written_at": time.time(), "pid": 1,
                                        "interval_seconds": 5, "active": [], "broker": {"state": "connected"}})


@pytest.mark.parametrize("flag,value,bound", [
    ("--poll", "1e10", "<= 604800 (a week)"),
    ("--poll", "604801", "<= 604800 (a week)"),
    ("--deadline", "1e10", "<= 1209600 (two weeks)"),  # its variable's: TASKHERD_DRAIN_DEADLINE
    ("--deadline", "1209601", "<= 1209600 (two weeks)"),
])
def test_drain_refuses_a_wait_too_long_to_sleep_before_it_asks_the_worker_to_drain(tmp_path, flag, value, bound):
    _live_heartbeat(tmp_path)
    result = taskherd("drain", "--dir", str(tmp_path), flag, value)
    usage_error(result, f"option {flag}={value!r} must be a positive number of seconds (finite: not nan or inf; "
                        f"valid: a number of seconds > 0 and {bound})")
    assert not os.path.exists(shared_files.drain_request_path(str(tmp_path))), "the worker was asked to drain"


def test_drain_takes_the_largest_values_in_range(tmp_path):
    """At the bound the drain is asked for and ends (no worker acknowledges: exit 1 after its timeout
    would take 10 s; a heartbeat that says it is draining already is acknowledged at once)."""
    record = {"format": shared_files.FORMAT, "written_at": time.time() + 60, "pid": 1, "interval_seconds": 5,
              "active": [], "broker": {"state": "connected"}, "draining_since": time.time() + 30}
    shared_files.write_json_atomically(shared_files.heartbeat_path(str(tmp_path)), record)
    result = taskherd("drain", "--dir", str(tmp_path), "--poll", "604800", "--deadline", "1209600")
    assert result.returncode == 0 and "worker idle" in result.stdout, result.stderr + result.stdout


@pytest.mark.parametrize("argv,says", [
    (["liveness", "--max-age", "1e10"], "option --max-age='1e10' must be a positive number of seconds (finite: "
                                        "not nan or inf; valid: a number of seconds > 0 and <= 604800 (a week))"),
    (["readiness", "--max-age", "604801"], "option --max-age='604801' must be a positive number"),
    (["liveness", "--task-margin", "1e300"], "option --task-margin='1e300' must be a positive number of seconds or "
                                             "0 (finite: not nan or inf; valid: a number of seconds >= 0 and <= 604800"),
])
def test_probe_seconds_flags_have_the_commands_maximum(tmp_path, argv, says):
    _live_heartbeat(tmp_path)
    usage_error(taskherd("probe", *argv, "--dir", str(tmp_path)), says)


def test_the_pod_flags_share_the_bound_of_the_other_commands_flags():
    assert flags.seconds("x", str(options.MAX_SECONDS)) == options.MAX_SECONDS == contract.MAX_SECONDS
    with pytest.raises(ValueError, match="<= 604800"):
        flags.seconds("x", str(options.MAX_SECONDS + 1))
    assert flags.seconds("x", "0", zero_allowed=True) == 0.0


# --- D9: dlq's queue-name flags and AMQP's 255-byte limit ------------------------------------------

LONG, WIDE = "q" * 300, "é" * 200  # 300 and 400 bytes of UTF-8


@pytest.mark.parametrize("argv,says", [
    (["list", "-Q", LONG], f"-Q/--queues={LONG[:60]!r}…(300 characters) is 300 bytes in UTF-8; RabbitMQ takes "
                           f"queue names of at most 255 bytes (valid: a name of at most 255 bytes)"),
    (["list", "--dlq", LONG], f"--dlq={LONG[:60]!r}…(300 characters) is 300 bytes in UTF-8"),
    (["purge", "--force", "--dlq", LONG], f"--dlq={LONG[:60]!r}…(300 characters) is 300 bytes"),
    (["redrive", "--all", "-Q", "orders", "--to", LONG], f"--to={LONG[:60]!r}…(300 characters) is 300 bytes"),
    (["redrive", "--all", "-Q", "orders", "--to", WIDE], f"--to={WIDE[:60]!r}…(200 characters) is 400 bytes"),
    (["list", "-Q", "orders", "--dead-letter-queues", LONG], f"--dead-letter-queues={LONG[:60]!r}…"),
    # a work queue that fits, its DLQ derived by the pattern does not
    (["list", "-Q", "q" * 253], "--dead-letter-pattern='{queue}.dlq': the DLQ of -Q/--queues="),
    (["list", "-Q", "q" * 250, "--dead-letter-pattern", "{queue}.dead-letters"],
     "which is 263 bytes in UTF-8; RabbitMQ takes queue names of at most 255 bytes"),
])
def test_dlq_refuses_a_queue_name_rabbitmq_cannot_take_naming_the_flag(argv, says):
    usage_error(taskherd("dlq", argv[0], "-b", UNREACHABLE_AMQP, *argv[1:]), says)


def test_dlq_names_the_variable_when_the_queue_came_from_it():
    result = taskherd("dlq", "list", "-b", UNREACHABLE_AMQP, env={"TASKHERD_QUEUES": LONG})
    usage_error(result, f"TASKHERD_QUEUES={LONG[:60]!r}…(300 characters) is 300 bytes in UTF-8")
    result = taskherd("dlq", "list", "-b", UNREACHABLE_AMQP, "-Q", "orders",
                      env={"TASKHERD_DEAD_LETTER_QUEUES": LONG})
    usage_error(result, f"TASKHERD_DEAD_LETTER_QUEUES={LONG[:60]!r}…")


def test_a_queue_name_that_is_not_utf8_is_refused_on_either_broker():
    for broker in (UNREACHABLE_AMQP, UNREACHABLE_REDIS):
        result = subprocess.run([*TASKHERD, "dlq", "list", "-b", broker, "-Q", b"or\xffders"], capture_output=True,
                                timeout=60, env={k: v for k, v in os.environ.items() if not k.startswith("TASKHERD_")})
        err = result.stderr.decode("utf-8", "replace")
        assert (result.returncode, "Traceback" in err) == (2, False), err
        assert "-Q/--queues='or\\udcffders' cannot be encoded in UTF-8" in err


def test_on_redis_a_long_queue_name_is_no_usage_error():
    """A Redis queue name is part of a key: no 255-byte limit (the broker is reached: exit 1)."""
    result = taskherd("dlq", "list", "-b", UNREACHABLE_REDIS, "-Q", LONG)
    assert result.returncode == 1 and "cannot use the broker" in result.stderr, result.stderr


def test_a_too_long_name_changes_nothing_in_the_dlq(amqp_url, unique_name):
    """Against RabbitMQ: the refused redrive and purge leave the dead letter where it is."""
    from kombu import Connection, Queue

    dlq_name = f"{unique_name}.dlq"
    with Connection(amqp_url) as connection:
        channel = connection.default_channel
        Queue(dlq_name, durable=True)(channel).declare()
        connection.Producer(channel).publish({"x": 1}, routing_key=dlq_name, serializer="json",
                                             headers={"id": "t1", "task": "core.record"})
        for argv in (["redrive", "--all", "-Q", unique_name, "--to", WIDE],
                     ["purge", "--force", "-Q", unique_name, "--dead-letter-queues", LONG]):
            usage_error(taskherd("dlq", argv[0], "-b", amqp_url, *argv[1:]), "RabbitMQ takes queue names")
        _, count, _ = channel.queue_declare(dlq_name, passive=True)
        assert count == 1


def test_redrive_does_not_publish_to_a_letters_queue_rabbitmq_cannot_take(monkeypatch):
    """A dead letter whose own queue (from its envelope) is over 255 bytes is not redriven and stays:
    no publish that py-amqp fails to pack (struct.error) in the middle of a redrive."""
    from taskherd.commands import dlq
    from taskherd.worker.deadletter import ENVELOPE_HEADER, Envelope

    published = []
    monkeypatch.setattr(dlq, "publish_back", lambda *a, **k: published.append(a))
    envelope = Envelope(queue=LONG, task="core.record", task_id="t1", reason="max-retries", detail="boom",
                        args=[], kwargs={})
    letter = dlq.parse(json.dumps(envelope.to_dict()).encode(), {ENVELOPE_HEADER: 1}, "application/json", "utf-8")

    class Store:
        removed = []

        def remove(self, letter):
            self.removed.append(letter)

    out, err = io.StringIO(), io.StringIO()
    assert dlq._redrive(Store(), [letter], UNREACHABLE_AMQP, to=None, keyprefix="", stdout=out, stderr=err) == 1
    assert published == [] and Store.removed == [] and out.getvalue() == ""
    (line,) = err.getvalue().splitlines()
    assert "t1: its queue" in line and "is 300 bytes in UTF-8" in line and "pass --to QUEUE" in line


# --- D16: ping and sentinel:// ---------------------------------------------------------------------

def test_ping_refuses_sentinel_without_an_app_naming_the_flag_and_the_valid_schemes():
    for argv, env, flag in ((["-b", "sentinel://127.0.0.1:26379"], {}, "-b/--broker"),
                            ([], {"TASKHERD_BROKER_URL": "sentinel://127.0.0.1:26379"}, "TASKHERD_BROKER_URL")):
        result = taskherd("ping", *argv, "-Q", "q", "--timeout", "2", env=env)
        line = usage_error(result, f"{flag}=sentinel://… needs kombu's master_name transport option")
        assert "valid without -A/--app: redis://, rediss://" in line and "amqp://" in line


@pytest.fixture
def sentinel_apps(tmp_path):
    (tmp_path / "no_master_app.py").write_text(
        "from celery import Celery\napp = Celery('s', broker='sentinel://127.0.0.1:1')\n")
    (tmp_path / "master_app.py").write_text(
        "from celery import Celery\napp = Celery('s', broker='sentinel://127.0.0.1:1')\n"
        "app.conf.broker_transport_options = {'master_name': 'mymaster'}\n")
    return tmp_path


def test_ping_with_an_app_takes_sentinel_when_the_app_names_its_master(sentinel_apps):
    result = taskherd("ping", "-A", "no_master_app", "-Q", "q", "--timeout", "2", cwd=sentinel_apps)
    usage_error(result, "-A/--app='no_master_app': its broker_url sentinel://… needs kombu's master_name transport "
                        "option, and the app sets none (valid: an app whose broker_transport_options has master_name")
    result = taskherd("ping", "-A", "no_master_app", "-b", "sentinel://127.0.0.1:1", "-Q", "q", "--timeout", "2",
                      cwd=sentinel_apps)
    usage_error(result, "-b/--broker=sentinel://… needs kombu's master_name transport option, and "
                        "-A/--app='no_master_app' sets none")
    # with master_name the sentinel is asked (nothing listens: exit 1, an environment problem)
    result = taskherd("ping", "-A", "master_app", "-Q", "q", "--timeout", "2", cwd=sentinel_apps)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert "master_name" not in result.stderr and "No master found for 'mymaster'" in result.stderr
