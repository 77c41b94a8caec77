"""`taskherd`: one command listing every subcommand; each answers --help with its usage and exit 0."""
import os
import subprocess
import sys

import pytest

from taskherd import cli

TASKHERD = [sys.executable, "-m", "taskherd.cli"]
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
SUBCOMMANDS = [["probe"], ["probe", "liveness"], ["probe", "readiness"], ["probe", "startup"], ["drain"],
               ["dlq"], ["dlq", "list"], ["dlq", "show"], ["dlq", "redrive"], ["dlq", "purge"],
               ["outbox"], ["outbox", "relay"], ["outbox", "migrate"], ["outbox", "status"],
               ["exporter"], ["recover"]]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*TASKHERD, *args], capture_output=True, text=True, timeout=60)


def test_help_lists_every_command_and_version_prints_the_package_version():
    result = run("--help")
    assert result.returncode == 0
    for name in cli.COMMANDS:
        assert f"  {name} " in result.stdout
    version = run("--version")
    assert version.returncode == 0 and version.stdout.startswith("taskherd 0.")


@pytest.mark.parametrize("command", SUBCOMMANDS, ids=" ".join)
def test_every_command_answers_help_with_its_usage(command):
    result = run(*command, "--help")
    assert result.returncode == 0, result.stderr
    assert "usage: taskherd " + command[0] in result.stdout


def test_an_unknown_command_is_a_usage_error_listing_the_commands():
    result = run("drian")
    assert result.returncode == 2 and "unknown command 'drian'" in result.stderr and "drain" in result.stderr


@pytest.mark.parametrize("command,flag", [(["dlq", "list"], "-b"), (["exporter"], "-b"), (["outbox", "relay"], "-b"),
                                          (["recover"], "-b"), (["dlq", "list"], "-Q"), (["exporter"], "-Q"),
                                          (["outbox", "relay"], "-A"), (["dlq", "list"], "--global-keyprefix"),
                                          (["exporter"], "--global-keyprefix"), (["recover"], "--global-keyprefix"),
                                          (["exporter"], "--dead-letter-queues"), (["dlq", "list"], "--dead-letter-queues"),
                                          (["dlq", "list"], "--queue")])
def test_options_are_spelled_as_celery_spells_them_everywhere(command, flag):
    assert flag in run(*command, "--help").stdout


#: Nothing listens on port 1 of loopback: a broker that cannot be reached, refused at once.
UNREACHABLE_REDIS, UNREACHABLE_AMQP = "redis://127.0.0.1:1/0", "amqp://guest:hunter2@127.0.0.1:1//"
REDIS = "redis://127.0.0.1:6390/1"
#: (command line, environment, exit status, what stderr must say). Usage errors (2) name the flag or
#: variable as the user wrote it and the valid range; an unreachable broker or database is one line (1).
BAD_INPUT = [
    (["dlq", "list", "-b", REDIS, "-Q", "q", "--limit", "-1"], {}, 2, "--limit='-1' is not an integer >= 1"),
    (["dlq", "list", "-b", REDIS, "-Q", "q", "--limit", "0"], {}, 2, "--limit='0' is not an integer >= 1"),
    (["dlq", "list", "-b", REDIS, "--dlq", ""], {}, 2, "--dlq='' is empty (valid: a queue name)"),
    (["dlq", "redrive", "-b", REDIS, "-Q", "q", "--all", "--to", " "], {}, 2, "--to=' ' is empty"),
    (["dlq", "list", "-b", REDIS, "-Q", "q", "--dead-letter-pattern", "{queue}.{dlq}"], {}, 2,
     "--dead-letter-pattern='{queue}.{dlq}' is not a valid pattern"),
    (["dlq", "list", "-b", REDIS, "-Q", "q", "--dead-letter-pattern", "{queue}{0}"], {}, 2,
     "--dead-letter-pattern='{queue}{0}' is not a valid pattern"),
    (["dlq", "list", "-b", "redis://:99999", "-Q", "q"], {}, 2,
     "-b/--broker='redis://:99999': Port out of range 0-65535 (valid: a port in 1..65535)"),
    (["dlq", "list", "-b", "amqp://u:hunter2@127.0.0.1:abc//", "-Q", "q"], {}, 2,
     "-b/--broker='amqp://u:***@127.0.0.1:abc//': Port could not be cast to integer"),
    (["dlq", "list", "-b", "redis://127.0.0.1:6390/orders", "-Q", "q"], {}, 2,
     "the Redis database 'orders' is not a number (valid: /0, /1, …)"),
    # a base64 password's '/' unescaped: urllib reads "hunter2" as the port; neither it nor the rest is shown
    (["dlq", "list", "-b", "amqp://u:hunter2/x+y==@127.0.0.1:5672//", "-Q", "q"], {}, 2,
     "-b/--broker='amqp://u:***@127.0.0.1:5672//': a '/', '?' or '#' in the user or password is written unescaped"),
    (["exporter", "-b", REDIS, "-Q", "q", "--management-url", "http://u:hunter2/x@rabbit:15672"], {}, 2,
     "--management-url='http://u:***@rabbit:15672': a '/', '?' or '#' in the user or password is written"),
    (["dlq", "list", "-b", "amqp://u:pw@127.0.0.1:5672/shop\n", "-Q", "q"], {}, 2,
     "-b/--broker='amqp://u:***@127.0.0.1:5672/shop\\n': it ends with a newline"),
    (["dlq", "list", "-Q", "q"], {"TASKHERD_BROKER_URL": "redis://:pw@127.0.0.1:99999/0"}, 2,
     "TASKHERD_BROKER_URL='redis://:***@127.0.0.1:99999/0' is invalid: Port out of range"),
    (["dlq", "list", "-b", UNREACHABLE_REDIS, "-Q", "q"], {}, 1,
     f"cannot use the broker at {UNREACHABLE_REDIS}: ConnectionError"),
    (["dlq", "list", "-b", UNREACHABLE_AMQP, "-Q", "q"], {}, 1,
     "cannot use the broker at amqp://guest:***@127.0.0.1:1//: ConnectionRefusedError"),
    (["recover", "-b", REDIS, "--watch", "inf"], {}, 2, "--watch='inf' is not a number of seconds > 0 and <= 604800"),
    (["recover", "-b", REDIS, "--watch", "1e309"], {}, 2, "--watch='1e309' is not a number of seconds > 0"),
    (["recover", "-b", REDIS, "--watch", "nan"], {}, 2, "--watch='nan' is not a number of seconds > 0"),
    (["recover", "-b", UNREACHABLE_REDIS], {}, 1, f"cannot use the broker at {UNREACHABLE_REDIS}: ConnectionError"),
    (["ping", "-b", REDIS, "-Q", "q", "--timeout", "inf"], {}, 2, "--timeout='inf' is not a number of seconds > 0"),
    (["ping", "-b", REDIS, "-Q", "q", "--timeout", "-0"], {}, 2, "--timeout='-0' is not a number of seconds > 0"),
    (["ping", "-b", "amqp://127.0.0.1:99999//", "-Q", "q"], {}, 2, "-b/--broker='amqp://127.0.0.1:99999//': Port"),
    (["ping", "-b", "http://127.0.0.1:1", "-Q", "q"], {}, 2, "-b/--broker=http://… is not supported here"),
    # kombu's Sentinel transport needs master_name, a transport option only an app (-A) gives
    (["ping", "-b", "sentinel://127.0.0.1:26379", "-Q", "q"], {}, 2,
     "-b/--broker=sentinel://… needs kombu's master_name transport option, which ping takes from the app of "
     "-A/--app (its broker_transport_options) (valid without -A/--app: redis://, rediss://"),
    # AMQP sends a queue name as a short string: at most 255 bytes of UTF-8 (py-amqp: struct.error)
    (["dlq", "list", "-b", UNREACHABLE_AMQP, "-Q", "q" * 300], {}, 2,
     "-Q/--queues='" + "q" * 60 + "'…(300 characters) is 300 bytes in UTF-8; RabbitMQ takes queue names of at "
     "most 255 bytes (valid: a name of at most 255 bytes)"),
    (["dlq", "list", "-b", UNREACHABLE_AMQP, "--dlq", "q" * 300], {}, 2, "--dlq='" + "q" * 60 + "'…(300 characters)"),
    (["dlq", "purge", "--force", "-b", UNREACHABLE_AMQP, "--dlq", "q" * 300], {}, 2, "is 300 bytes in UTF-8"),
    (["dlq", "redrive", "--all", "-b", UNREACHABLE_AMQP, "-Q", "q", "--to", "é" * 200], {}, 2,
     "--to='" + "é" * 60 + "'…(200 characters) is 400 bytes in UTF-8; RabbitMQ takes queue names of at most 255"),
    (["dlq", "list", "-b", UNREACHABLE_AMQP, "-Q", "q" * 253], {}, 2,
     "--dead-letter-pattern='{queue}.dlq': the DLQ of -Q/--queues="),
    (["exporter", "-b", REDIS, "-Q", "q", "--interval", "1e309"], {}, 2, "--interval='1e309' is not a number of seconds"),
    (["exporter", "-b", REDIS, "-Q", "q", "--visibility-timeout", "-5"], {}, 2,
     "--visibility-timeout='-5' is not a number of seconds > 0"),
    (["exporter", "-b", REDIS, "-Q", "q", "--port", "0"], {}, 2, "--port='0' is not an integer in 1..65535"),
    # the flag judged as TASKHERD_MANAGEMENT_URL is (it was taken: a traceback at the first poll, or
    # ftp:// and port 0 polled for ever)
    (["exporter", "-b", REDIS, "-Q", "q", "--management-url", "ftp://rabbit"], {}, 2,
     "--management-url='ftp://rabbit': not an http:// or https:// URL with a host (valid: an http:// or https://"),
    (["exporter", "-b", REDIS, "-Q", "q", "--management-url", "http://u:hunter2@rabbit:0"], {}, 2,
     "--management-url='http://u:***@rabbit:0': the port '0' is not a number in range (valid: a port from 1 to"),
    (["exporter", "-b", REDIS, "-Q", "q", "--management-url", "rabbit:15672 "], {}, 2,
     "--management-url='rabbit:15672 ': whitespace in it"),
    (["exporter", "-b", REDIS, "-Q", "q", "--address", "no-such-host.invalid", "--port", "19892"], {}, 1,
     "cannot serve /metrics on --address='no-such-host.invalid' --port=19892"),
    (["exporter", "-b", REDIS, "-Q", "q"], {"TASKHERD_EXPORTER_PORT": "0"}, 2,
     "TASKHERD_EXPORTER_PORT='0' is invalid: expected a port number 1-65535"),
    (["exporter", "-b", REDIS, "-Q", "q"], {"TASKHERD_EXPORTER_INTERVAL": "soon"}, 2,
     "TASKHERD_EXPORTER_INTERVAL='soon' is invalid: expected a number of seconds > 0"),
    (["outbox", "relay", "--dsn", "postgresql://127.0.0.1:1/x", "-b", REDIS, "--poll-interval", "inf"], {}, 2,
     "--poll-interval='inf' is not a number of seconds > 0"),
    (["outbox", "status", "--dsn", "notadsn"], {}, 2, "--dsn='notadsn' is not a PostgreSQL DSN"),
    (["outbox", "status"], {"TASKHERD_OUTBOX_DSN": "nodsn"}, 2, "TASKHERD_OUTBOX_DSN='nodsn' is not a PostgreSQL DSN"),
    # libpq's own forms are DSNs too (urllib cannot parse a multi-host URI): they get as far as connecting
    (["outbox", "status"], {"TASKHERD_OUTBOX_DSN": "postgresql://127.0.0.1:1,127.0.0.1:2/x"}, 1,
     "taskherd outbox status: cannot use the database: OperationalError"),
    (["outbox", "status"], {"TASKHERD_OUTBOX_DSN": "host=127.0.0.1 port=1 dbname=x"}, 1,
     "taskherd outbox status: cannot use the database: OperationalError"),
    (["outbox", "status", "--dsn", "postgresql://127.0.0.1:1/x"], {}, 1,
     "taskherd outbox status: cannot use the database: OperationalError"),
    (["outbox", "relay", "--dsn", "postgresql://127.0.0.1:1/x", "-b", "redis://:99999"], {}, 2,
     "-b/--broker='redis://:99999': Port out of range"),
    # pod-side commands: nan compared false with every age, so --max-age nan disabled liveness
    (["probe", "liveness", "--max-age", "nan"], {}, 2, "option --max-age='nan' must be a positive number of seconds (finite"),
    (["probe", "liveness", "--task-margin", "inf"], {}, 2, "option --task-margin='inf' must be a positive number of seconds or 0 (finite"),
    (["drain", "--poll", "nan"], {}, 2, "option --poll='nan' must be a positive number of seconds (finite"),
    (["drain", "--deadline", "1e309"], {}, 2, "option --deadline='1e309' must be a positive number"),
    # a bound, as the other commands' seconds flags (a week; --deadline: TASKHERD_DRAIN_DEADLINE's two
    # weeks): --poll 1e10 wrote drain-request.json, then time.sleep raised OverflowError
    (["drain", "--poll", "1e10"], {}, 2,
     "option --poll='1e10' must be a positive number of seconds (finite: not nan or inf; valid: a number of "
     "seconds > 0 and <= 604800 (a week))"),
    (["drain", "--deadline", "1209601"], {}, 2, "option --deadline='1209601' must be a positive number of seconds "
                                                "(finite: not nan or inf; valid: a number of seconds > 0 and <= 1209600"),
    (["probe", "liveness", "--max-age", "1e10"], {}, 2, "option --max-age='1e10' must be a positive number"),
    (["probe", "liveness", "--task-margin", "604801"], {}, 2,
     "option --task-margin='604801' must be a positive number of seconds or 0 (finite: not nan or inf; valid: a "
     "number of seconds >= 0 and <= 604800"),
    (["worker", "-A", "apps.core_app", "--time-limit", "inf"], {}, 2, "--time-limit='inf' must be a finite number >= 0"),
    (["worker", "-A", "apps.core_app", "--soft-time-limit", "nan"], {}, 2, "--soft-time-limit='nan' must be a finite"),
    (["worker", "-A", "apps.core_app", "--prefetch-multiplier", "0"], {}, 2,
     "--prefetch-multiplier='0' must be an integer >= 1"),
    (["worker", "-A", "apps.core_app", "-Q", ""], {}, 2, "--queues='' has an empty queue name"),
    (["worker", "-A", "apps.core_app", "-Q", "orders,,mail"], {}, 2, "--queues='orders,,mail' has an empty queue name"),
    (["worker", "-A", "apps.core_app", "-l", "verbose"], {}, 2, "--loglevel='verbose' is not a log level (valid: DEBUG"),
    (["worker", "-A", "apps.core_app", "-P", "forks"], {}, 2, "--pool='forks' is not a pool (valid: prefork"),
    (["worker", "-A", "no_such_module_of_yours"], {}, 2,
     "--app='no_such_module_of_yours': no module named 'no_such_module_of_yours'"),
    # an option is written whole, as `celery worker` wants it: an abbreviation was taken for the
    # option it began (--time for --time-limit) where the chart's check of extraArgs and Celery
    # read another one
    (["worker", "-A", "apps.core_app", "--conc=16"], {}, 2, "No such option '--conc'. Did you mean '--concurrency'?"),
    (["worker", "-A", "apps.core_app", "--time=1800"], {}, 2, "No such option '--time'"),
    (["recover", "-b", REDIS, "--glob=x"], {}, 2, "unrecognized arguments: --glob=x"),
    (["dlq", "list", "-b", REDIS, "-Q", "q", "--lim", "3"], {}, 2, "unrecognized arguments: --lim 3"),
    (["exporter", "-b", REDIS, "--inter=5"], {}, 2, "unrecognized arguments: --inter=5"),
]


@pytest.mark.parametrize("argv,env,status,says", BAD_INPUT, ids=[" ".join(case[0])[:60] for case in BAD_INPUT])
def test_bad_input_is_a_clear_error_naming_the_flag_without_a_traceback(argv, env, status, says):
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("TASKHERD_", "DATABASE_URL"))}
    result = subprocess.run([*TASKHERD, *argv], capture_output=True, text=True, timeout=60, cwd=TESTS_DIR,
                            env={**environ, **env, "PYTHONPATH": TESTS_DIR})
    assert (result.returncode, "Traceback" in result.stderr) == (status, False), result.stderr
    assert says in result.stderr
    assert "hunter2" not in result.stderr and ":pw@" not in result.stderr, "a password was printed"


def test_outbox_commands_say_what_is_wrong_in_one_line(pg_dsn, amqp_url, unique_name, tmp_path):
    """A table that is not there, an app module that is not there, and a relay without -A/--app whose
    bare queue declaration RabbitMQ refuses (the workers' profile declared it with dead-letter
    arguments): each was a raw traceback (139 lines for the last)."""
    import psycopg
    from celery import Celery

    from taskherd.worker import configure, outbox

    environ = {k: v for k, v in os.environ.items() if not k.startswith(("TASKHERD_", "DATABASE_URL"))}

    def outbox_command(*argv):
        return subprocess.run([*TASKHERD, "outbox", *argv, "--dsn", pg_dsn], capture_output=True, text=True,
                              timeout=60, cwd=tmp_path, env=environ)

    result = outbox_command("status", "--table", "no_such_table")
    assert (result.returncode, "Traceback" in result.stderr) == (1, False), result.stderr
    assert "there is no table 'no_such_table' in this database (--table; `taskherd outbox migrate" in result.stderr
    result = outbox_command("relay", "-A", "no_such_module.app", "--once")
    assert (result.returncode, "Traceback" in result.stderr) == (2, False), result.stderr
    assert "--app='no_such_module.app': no module named 'no_such_module'" in result.stderr

    workers = Celery("workers", broker=amqp_url, set_as_current=False)
    configure(workers, queues=[unique_name])
    with workers.connection_for_write() as connection:  # as a worker's start declares it
        workers.amqp.queues[unique_name].bind(connection.default_channel).declare()
    workers.close()
    with psycopg.connect(pg_dsn) as conn:
        outbox.create_table(conn)
        with conn.transaction():
            outbox.enqueue(conn, "core.record", ["from-the-outbox"], queue=unique_name)
    result = outbox_command("relay", "-b", amqp_url, "--once")
    assert (result.returncode, "Traceback" in result.stderr) == (1, False), result.stderr[-3000:]
    assert "RabbitMQ refused to declare a queue as this relay would" in result.stderr
    assert "valid: -A/--app module:app" in result.stderr
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM taskherd_outbox WHERE sent_at IS NULL").fetchone() == (1,)
