"""Bad input to the commands and the contract's variables: a usage error naming the option or variable
as written and the valid range, before anything connects; never a traceback. No services needed:
every case is refused before a broker is reached (a test that connected would fail on 127.0.0.1:1)."""
import argparse
import sys
import textwrap

import pytest

from taskherd import contract
from taskherd.commands import dlq, exporter, options, recover
from taskherd.commands import worker as worker_command

#: Nothing listens there: a command that got as far as connecting fails another way than asserted.
REDIS = "redis://127.0.0.1:1/0"
AMQP = "amqp://guest:hunter2@127.0.0.1:1//"


@pytest.fixture(autouse=True)
def _no_taskherd_environment(monkeypatch):
    for name in list(__import__("os").environ):
        if name.startswith("TASKHERD_"):
            monkeypatch.delenv(name)


def usage_error(capsys, command, argv) -> str:
    """stderr of a command that must end with argparse's usage error (exit 2)."""
    with pytest.raises(SystemExit) as exit_:
        command(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "hunter2" not in err, err
    return err


def exporter_main(argv):
    return exporter.parse_args(argv)


# -- 1. ';'-joined broker URLs: an empty item, mixed kinds ------------------------------------------
@pytest.mark.parametrize("url", [";redis://h/0", "amqp://u:hunter2@h/v;", "redis://a/0;;redis://b/0", ";"])
def test_an_empty_url_between_semicolons_is_refused_naming_the_variable(url):
    _, problems = contract.read(["TASKHERD_BROKER_URL"], {"TASKHERD_BROKER_URL": url})
    assert len(problems) == 1 and problems[0].startswith("TASKHERD_BROKER_URL="), problems
    assert "an empty URL between ';'" in problems[0] and "valid:" in problems[0]
    assert "hunter2" not in problems[0]


@pytest.mark.parametrize("url", ["redis://h/0;amqp://h//", "amqp://h//;rediss://h/0", "sentinel://h:1;pyamqp://h//"])
def test_a_failover_list_of_two_broker_kinds_is_refused(url):
    _, problems = contract.read(["TASKHERD_BROKER_URL"], {"TASKHERD_BROKER_URL": url})
    assert len(problems) == 1 and "mixes broker kinds" in problems[0], problems
    assert "valid: every URL redis://… or every URL amqp://…" in problems[0]


def test_a_failover_list_of_one_kind_is_still_a_broker_url():
    assert contract.broker_url("amqp://a//;amqp://b//") == "amqp://a//;amqp://b//"
    assert contract.broker_url("redis://a/0;redis://b/0") == "redis://a/0;redis://b/0"


@pytest.mark.parametrize("url,says", [
    (";redis://127.0.0.1:1/0", "-b/--broker=';redis://127.0.0.1:1/0': an empty URL between ';'"),
    ("amqp://u:hunter2@127.0.0.1:1//;", "-b/--broker='amqp://u:***@127.0.0.1:1//;': an empty URL between ';'"),
    ("redis://127.0.0.1:1/0;amqp://127.0.0.1:1//", "mixes broker kinds (redis://, amqp://)"),
])
def test_the_broker_flag_says_why_a_joined_url_is_refused(capsys, url, says):
    err = usage_error(capsys, dlq.main, ["list", "-b", url, "-Q", "q"])
    assert says in err
    assert "is not supported here" not in err  # the old message, which did not say why


def test_the_variable_is_named_when_the_broker_url_came_from_it(capsys, monkeypatch):
    monkeypatch.setenv("TASKHERD_BROKER_URL", "amqp://u:hunter2@127.0.0.1:1/v;")
    err = usage_error(capsys, dlq.main, ["list", "-Q", "q"])
    assert "TASKHERD_BROKER_URL='amqp://u:***@127.0.0.1:1/v;' is invalid: an empty URL between ';'" in err


# -- 2. the schemes a command accepts are the ones it can use ---------------------------------------
@pytest.mark.parametrize("command,argv,valid", [
    (recover.main, ["-b", "sentinel://127.0.0.1:1"], "(valid: redis://, rediss://)"),
    (recover.main, ["-b", "redis+socket:///tmp/no.sock"], "(valid: redis://, rediss://)"),
    (recover.main, ["-b", AMQP], "(valid: redis://, rediss://)"),
    (dlq.main, ["list", "-b", "redis+socket:///tmp/no.sock", "-Q", "a"], "(valid: redis://, rediss://, amqp://"),
    (dlq.main, ["purge", "-b", "sentinel://127.0.0.1:1", "-Q", "a", "--force"], "(valid: redis://, rediss://"),
    (dlq.main, ["list", "-b", "librabbitmq://127.0.0.1:1//", "-Q", "a"], "amqps://, pyamqp://)"),
    (exporter_main, ["-b", "sentinel://127.0.0.1:1", "-Q", "a"], "(valid: redis://, rediss://, amqp://"),
    (exporter_main, ["-b", "redis+socket:///tmp/no.sock", "-Q", "a"], "(valid: redis://, rediss://"),
    (exporter_main, ["-b", "librabbitmq://127.0.0.1:1//", "-Q", "a"], "pyamqp://)"),
], ids=lambda value: value if isinstance(value, str) else None)
def test_a_command_refuses_a_scheme_its_own_client_cannot_use(capsys, monkeypatch, command, argv, valid):
    import redis

    def no_connection(*args, **kwargs):
        raise AssertionError("the URL reached redis-py")
    monkeypatch.setattr(redis.Redis, "from_url", no_connection)
    scheme = argv[argv.index("-b") + 1].partition("://")[0]
    err = usage_error(capsys, command, argv)
    assert f"-b/--broker={scheme}://… is not supported here" in err and valid in err, err
    assert f"{scheme}://" not in err.partition("(valid:")[2], "a refused scheme is listed as valid"


def test_the_variable_is_named_when_its_scheme_is_refused(capsys, monkeypatch):
    monkeypatch.setenv("TASKHERD_BROKER_URL", "sentinel://127.0.0.1:1")
    err = usage_error(capsys, recover.main, [])
    assert "TASKHERD_BROKER_URL=sentinel://… is not supported here" in err


@pytest.mark.parametrize("command,argv,says", [
    # recover never talks to RabbitMQ: not "talks to RabbitMQ with py-amqp"
    (recover.main, ["-b", AMQP], "taskherd recover is for Redis brokers only (RabbitMQ redelivers a dead worker's "
                                 "unacknowledged messages by itself"),
    (recover.main, ["-b", "sqs://127.0.0.1:1"],
     "taskherd recover is for Redis brokers only (valid: redis://, rediss://)"),
    (recover.main, ["-b", "sentinel://127.0.0.1:1"], "taskherd recover talks to Redis with redis-py, which takes no "
                                                     "sentinel:// URL"),
    (exporter_main, ["-b", "librabbitmq://127.0.0.1:1//", "-Q", "a"],
     "taskherd exporter talks to RabbitMQ with py-amqp, which takes no librabbitmq:// URL"),
    (dlq.main, ["list", "-b", "memory://", "-Q", "a"], "taskherd dlq is for Redis and RabbitMQ brokers only"),
], ids=lambda value: value if isinstance(value, str) else None)
def test_a_refused_scheme_says_what_the_command_connects_to(capsys, command, argv, says):
    err = usage_error(capsys, command, argv)
    assert says in " ".join(err.split()), err
    if command is recover.main:
        assert "py-amqp" not in err and "talks to RabbitMQ" not in err, err


@pytest.mark.parametrize("command,takes,not_taken", [
    (recover.main, "broker URL, redis://… or rediss://…; Redis only", ["amqp", "sentinel"]),
    (exporter_main, "broker URL, redis://…, rediss://…, amqp://…, amqps://… or pyamqp://…",
     ["sentinel", "librabbitmq"]),
], ids=["recover", "exporter"])
def test_the_broker_help_names_only_the_schemes_the_command_takes(capsys, command, takes, not_taken):
    with pytest.raises(SystemExit) as exit_:
        command(["--help"])
    assert exit_.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    broker_help = out.partition("--broker BROKER ")[2].partition("(default: $TASKHERD_BROKER_URL)")[0]
    assert broker_help.startswith(takes), broker_help
    assert not any(scheme in broker_help for scheme in not_taken), broker_help


@pytest.mark.parametrize("command,argv", [
    (recover.main, ["-b", "redis://127.0.0.1:1/1;redis://127.0.0.1:2/1"]),
    (dlq.main, ["list", "-b", "redis://127.0.0.1:1/1;redis://127.0.0.1:2/1", "-Q", "a"]),
])
def test_a_failover_list_is_refused_where_one_url_is_read(capsys, command, argv):
    # redis-py reads 'redis://a/1;redis://b/1' as host a, database 0
    err = usage_error(capsys, command, argv)
    assert "a ';'-joined failover list" in err and "(valid: one URL)" in err


def test_a_failover_list_is_taken_where_kombu_connects():
    parser = options.Parser(prog="taskherd dlq list")
    args = argparse.Namespace(broker="amqp://127.0.0.1:1//;amqp://127.0.0.1:2//")
    assert options.broker(parser, args, schemes=contract.REDIS_PY_SCHEMES + contract.PY_AMQP_SCHEMES,
                          failover=contract.PY_AMQP_SCHEMES) == args.broker
    args = argparse.Namespace(broker="sentinel://127.0.0.1:1;sentinel://127.0.0.1:2")
    assert options.broker(parser, args) == args.broker  # through Celery: kombu's every scheme


# -- 3. -P/--pool is loaded when the command line is read -------------------------------------------
@pytest.mark.parametrize("pool", ["nonexist:Cls", ":", "os:path", "custom", "taskherd.contract:nope"])
def test_a_pool_that_cannot_be_loaded_is_a_usage_error(capsys, pool):
    assert worker_command.main(["-A", "no_app_is_loaded_before_the_pool", "-P", pool]) == 2
    err = capsys.readouterr().err
    assert f"-P/--pool={pool!r}" in err and "valid: prefork" in err and "module:Class of a Celery pool" in err, err
    assert "Traceback" not in err


def test_a_pool_named_on_the_command_line_is_its_class():
    from celery.concurrency.thread import TaskPool

    args = worker_command.parser().parse_args(["-A", "x", "-P", "threads"])
    assert worker_command.worker_options(args)["pool_cls"] is TaskPool
    args = worker_command.parser().parse_args(["-A", "x", "-P", "celery.concurrency.thread:TaskPool"])
    assert worker_command.worker_options(args)["pool_cls"] is TaskPool


# -- 4. -A/--app: a missing attribute, or something that is no Celery app ----------------------------
@pytest.fixture
def app_module(tmp_path, monkeypatch):
    name = "cli_inputs_app"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent("""
        import json

        from celery import Celery
        app = Celery("cli_inputs_app", broker="redis://127.0.0.1:1/0", set_as_current=False)
        def configure():
            pass
    """))
    (tmp_path / "cli_inputs_broken.py").write_text("import a_dependency_that_is_not_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    for module in (name, "cli_inputs_broken"):
        sys.modules.pop(module, None)


@pytest.mark.parametrize("suffix,says", [
    (":nope", "module 'cli_inputs_app' has no attribute 'nope'"),
    (":configure", "names a function, not a Celery app"),
    (":json", "names a module, not a Celery app"),
])
def test_an_app_spec_naming_no_celery_app_is_one_line(app_module, suffix, says):
    spec = app_module + suffix
    with pytest.raises(options.AppNotFound) as refused:
        options.find_app(spec)
    assert str(refused.value).startswith(f"-A/--app={spec!r}") and says in str(refused.value)
    assert "valid: a module path as for `celery -A`" in str(refused.value)


@pytest.mark.parametrize("spec,says", [
    ("os", "module 'os' has no Celery app"),
    (":", "-A/--app=':'"),
    ("no_such_module_of_yours:app", "no module named 'no_such_module_of_yours'"),
])
def test_an_app_spec_without_a_module_or_app_is_one_line(spec, says):
    with pytest.raises(options.AppNotFound) as refused:
        options.find_app(spec)
    assert says in str(refused.value)


def test_the_worker_command_refuses_a_missing_attribute_in_one_line(capsys, app_module):
    assert worker_command.main(["-A", f"{app_module}:nope"]) == 2
    err = capsys.readouterr().err
    assert f"taskherd worker: -A/--app='{app_module}:nope': module '{app_module}' has no attribute 'nope'" in err


def test_an_import_failing_inside_the_users_module_keeps_its_own_error(app_module):
    with pytest.raises(ModuleNotFoundError, match="a_dependency_that_is_not_installed"):
        options.find_app("cli_inputs_broken:app")
    assert options.find_app(f"{app_module}:app").main == "cli_inputs_app"


def test_a_value_error_raised_inside_the_users_module_is_raised_as_it_is(app_module, tmp_path):
    # kombu wraps it as ValueError("Couldn't import …"): it was taken for a malformed spec (exit 2,
    # "valid: a module path", no traceback)
    (tmp_path / "cli_inputs_raises.py").write_text('PORT = int("not-a-number")\n')
    for spec in ("cli_inputs_raises", "cli_inputs_raises:app"):
        with pytest.raises(ValueError, match="invalid literal for int") as raised:
            options.find_app(spec)
        assert not isinstance(raised.value, options.AppNotFound) and "Couldn't import" not in str(raised.value)
        with pytest.raises(options.AppImportFailed) as failed:
            options.load_app(spec)
        assert type(failed.value.error) is ValueError and failed.value.spec == spec


def test_the_worker_command_shows_the_users_import_error_first_then_its_traceback(capsys, app_module, tmp_path):
    (tmp_path / "cli_inputs_raises.py").write_text('PORT = int("not-a-number")\n')
    assert worker_command.main(["-A", "cli_inputs_raises"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("taskherd worker: invalid literal for int() with base 10: 'not-a-number'\n"), err
    assert "Traceback (most recent call last)" in err and 'cli_inputs_raises.py", line 1, in <module>' in err
    assert "valid: a module path" not in err


# -- 5. the contract's seconds have a maximum -------------------------------------------------------
@pytest.mark.parametrize("name,value", [
    ("TASKHERD_HEARTBEAT_INTERVAL", "1e300"), ("TASKHERD_RECOVERY_HEARTBEAT_INTERVAL", "1e10"),
    ("TASKHERD_RECOVERY_TIMEOUT", "604801"), ("TASKHERD_TIME_LIMIT", "1e309"), ("TASKHERD_SOFT_TIME_LIMIT", "nan"),
    ("TASKHERD_EXPORTER_INTERVAL", "1e9"), ("TASKHERD_VISIBILITY_TIMEOUT", "2592001"),
    ("TASKHERD_RABBITMQ_CONSUMER_TIMEOUT", "1e12"), ("TASKHERD_DRAIN_DEADLINE", "1209601"),
])
def test_a_duration_variable_past_its_maximum_is_refused_with_the_range(name, value):
    _, problems = contract.read([name], {name: value})
    assert len(problems) == 1 and problems[0].startswith(f"{name}={value!r} is invalid"), problems
    assert "expected a number of seconds > 0 and <= " in problems[0]


@pytest.mark.parametrize("name,value", [
    ("TASKHERD_HEARTBEAT_INTERVAL", "604800"), ("TASKHERD_TIME_LIMIT", "604800"),
    # what the chart renders: visibilityTimeoutSeconds up to 30 days, the drain deadline hard + margin
    ("TASKHERD_VISIBILITY_TIMEOUT", "2592000"), ("TASKHERD_DRAIN_DEADLINE", "608400"),
])
def test_a_duration_at_its_maximum_is_taken(name, value):
    values, problems = contract.read([name], {name: value})
    assert problems == [] and values[name] == float(value)


def test_a_command_flag_takes_the_range_of_its_variable(capsys):
    args = exporter.parse_args(["-b", REDIS, "-Q", "a", "--visibility-timeout", "2592000"])
    assert args.visibility_timeout == 2592000.0
    err = usage_error(capsys, exporter_main, ["-b", REDIS, "-Q", "a", "--visibility-timeout", "2592001"])
    assert "--visibility-timeout='2592001' is not a number of seconds > 0 and <= 2592000 (30 days)" in err
    assert worker_command.main(["-A", "x", "--time-limit", "1e300"]) == 2
    assert "--time-limit='1e300' must be a finite number >= 0 and <= 604800" in capsys.readouterr().err


# -- 6. queue names: each once, none empty ----------------------------------------------------------
@pytest.mark.parametrize("argv,env,says", [
    (["-Q", "a,a"], {}, "-Q/--queues='a,a' names 'a' more than once (valid: each queue once)"),
    (["-Q", "a", "-Q", "b,a"], {}, "-Q/--queues='a,b,a' names 'a' more than once"),
    ([], {"TASKHERD_QUEUES": "a,b,a"}, "TASKHERD_QUEUES='a,b,a' names 'a' more than once"),
    (["-Q", "a", "--dead-letter-queues", " , "], {}, "--dead-letter-queues=' , ' has an empty queue name"),
    (["-Q", "a", "--dead-letter-queues", ""], {}, "--dead-letter-queues='' has an empty queue name"),
    (["-Q", "a,b", "--dead-letter-queues", "x,x"], {}, "--dead-letter-queues='x,x' names 'x' more than once"),
    (["-Q", "a,b"], {"TASKHERD_DEAD_LETTER_QUEUES": "x"}, "TASKHERD_DEAD_LETTER_QUEUES='x' names 1 dead-letter"),
])
def test_queue_names_are_each_named_once(capsys, monkeypatch, argv, env, says):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    err = usage_error(capsys, exporter_main, ["-b", REDIS, *argv])
    assert says in err, err


def test_the_dlq_command_refuses_a_queue_named_twice(capsys):
    err = usage_error(capsys, dlq.main, ["list", "-b", REDIS, "-Q", "a,a"])
    assert "-Q/--queues='a,a' names 'a' more than once" in err


# -- 7. addresses to listen on ----------------------------------------------------------------------
@pytest.mark.parametrize("address", ["a" * 70, "999.1.1.1", "1.2.3", "1234", "256.0.0.1", "host name", "-x"])
def test_the_exporter_address_is_judged_as_its_variable_when_read(capsys, monkeypatch, address):
    import prometheus_client

    def not_reached(*args, **kwargs):
        raise AssertionError("the address reached the HTTP server")
    monkeypatch.setattr(prometheus_client, "start_http_server", not_reached)
    err = usage_error(capsys, exporter.main, ["-b", REDIS, "-Q", "a", f"--address={address}"])
    assert f"--address={address!r} is not {contract.LISTEN_ADDRESS_VALID}" in err
    _, problems = contract.read(["TASKHERD_METRICS_ADDR"], {"TASKHERD_METRICS_ADDR": address})
    assert problems == [f"TASKHERD_METRICS_ADDR={address!r} is invalid: expected {contract.LISTEN_ADDRESS_VALID}"]


@pytest.mark.parametrize("address,value", [("0.0.0.0", "0.0.0.0"), ("::", "::"), ("[::1]", "::1"),
                                           ("localhost", "localhost"), ("metrics.example.com", "metrics.example.com"),
                                           ("10.0.0.7", "10.0.0.7")])
def test_an_address_to_listen_on_is_taken(address, value):
    assert exporter.parse_args(["-b", REDIS, "-Q", "a", "--address", address]).address == value
    assert contract.listen_address(address) == value
