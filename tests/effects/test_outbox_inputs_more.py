"""Bad input to the outbox's functions, its Relay and `taskherd outbox`: refused with an error naming
the argument as written and the valid range, before any statement (the caller's transaction stays
usable), losing nothing, and never printing a password."""
from __future__ import annotations

import math
import subprocess
import sys

import psycopg
import pytest

from support.worker_process import TESTS_DIR, python_env
from taskherd.commands import outbox as outbox_command
from taskherd.worker import outbox

SECRET = "s3cr3t"
SECRET_DSN = f"postgresql://shop:{SECRET}@127.0.0.1:1/shop"


@pytest.fixture
def outbox_dsn(pg_dsn) -> str:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        outbox.create_table(conn)
        conn.execute("CREATE TABLE caller (who text)")
    return pg_dsn


def count(dsn: str, query: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(query).fetchone()[0]


def sent_rows(dsn: str, n: int) -> None:
    with psycopg.connect(dsn) as conn:
        for i in range(n):
            outbox.enqueue(conn, "shop.ship", args=[i])
        conn.execute("UPDATE taskherd_outbox SET sent_at = clock_timestamp()")


@pytest.mark.parametrize(("value", "shown"), [
    (-1, "-1"), (-0.001, "-0.001"), (math.nan, "nan"), (math.inf, "inf"), (-math.inf, "-inf"),
    ("abc", "'abc'"), ("5", "'5'"), (True, "True"), (None, "None"), ([1], r"\[1\]"),
])
def test_purge_sent_refuses_a_window_that_is_not_a_finite_number_at_least_0_before_any_statement(
        outbox_dsn, value, shown):
    """-1 deleted the rows sent a moment earlier (the audit trail), None deleted nothing silently,
    nan/inf/'abc'/True raised psycopg's errors from inside the caller's transaction."""
    sent_rows(outbox_dsn, 3)
    with psycopg.connect(outbox_dsn) as conn:
        conn.execute("INSERT INTO caller VALUES ('kept')")
        with pytest.raises((TypeError, ValueError),
                           match=rf"outbox.purge_sent older_than_seconds={shown}.*valid: a number >= 0 \(finite\)"):
            outbox.purge_sent(conn, older_than_seconds=value)
        conn.commit()  # refused before any statement: the caller's transaction is still usable
    assert count(outbox_dsn, "SELECT count(*) FROM taskherd_outbox") == 3
    assert count(outbox_dsn, "SELECT count(*) FROM caller") == 1


def test_purge_sent_keeps_a_window_and_a_window_longer_than_any_row_deletes_nothing(outbox_dsn):
    sent_rows(outbox_dsn, 3)
    with psycopg.connect(outbox_dsn, autocommit=True) as conn:
        assert outbox.purge_sent(conn, older_than_seconds=3600) == 0
        assert outbox.purge_sent(conn, older_than_seconds=1e300) == 0  # was: timestamp out of range
    with psycopg.connect(outbox_dsn, autocommit=True) as conn:
        assert outbox.purge_sent(conn, older_than_seconds=0) == 3


def relay(**settings):
    return outbox.Relay(**{"connect": lambda: None, "publish": lambda rows: None, **settings})


@pytest.mark.parametrize(("settings", "error", "says"), [
    ({"poll_interval_seconds": math.inf}, ValueError, r"poll_interval_seconds=inf; valid: a number of seconds > 0 "
                                                      r"and <= 604800 \(a week\)"),
    ({"poll_interval_seconds": 1e10}, ValueError, r"poll_interval_seconds=10000000000.0; valid: .*<= 604800"),
    ({"poll_interval_seconds": 604801}, ValueError, r"poll_interval_seconds=604801; valid"),
    ({"poll_interval_seconds": "1"}, ValueError, r"poll_interval_seconds='1'; valid"),
    ({"poll_interval_seconds": None}, ValueError, r"poll_interval_seconds=None; valid"),
    ({"poll_interval_seconds": True}, ValueError, r"poll_interval_seconds=True; valid"),
    ({"poll_interval_seconds": 10**400}, ValueError, r"poll_interval_seconds=<an int of"),
    ({"batch_size": True}, ValueError, r"batch_size=True; valid: an integer in 1..10000"),
    ({"batch_size": 0}, ValueError, r"batch_size=0; valid: an integer in 1..10000"),
    ({"batch_size": -1}, ValueError, r"batch_size=-1; valid"),
    ({"batch_size": 1.0}, ValueError, r"batch_size=1.0; valid"),
    ({"connect": None}, TypeError, r"outbox relay connect= got a NoneType; valid: a callable"),
    ({"publish": "x"}, TypeError, r"outbox relay publish= got a str; valid: a callable"),
])
def test_relay_refuses_settings_outside_the_commands_bounds_naming_them(settings, error, says):
    """inf and 1e10 were accepted, then run() died at its first idle wait (OverflowError); '1' and
    None raised a TypeError naming nothing; True was taken for 1."""
    with pytest.raises(error, match=says):
        relay(**settings)


def test_relay_takes_the_commands_largest_values():
    assert relay(poll_interval_seconds=604800, batch_size=10_000).poll_interval_seconds == 604800


@pytest.mark.parametrize("call", [
    lambda conn: outbox.create_table(conn),
    lambda conn: outbox.enqueue(conn, "shop.ship", []),
    lambda conn: outbox.status(conn),
    lambda conn: outbox.purge_sent(conn, older_than_seconds=60),
    lambda conn: outbox.has_refused_column(conn),
    lambda conn: outbox.add_missing_columns(conn),
], ids=["create_table", "enqueue", "status", "purge_sent", "has_refused_column", "add_missing_columns"])
@pytest.mark.parametrize("conn", [SECRET_DSN, None, b"dsn"], ids=["dsn", "none", "bytes"])
def test_a_conn_that_is_not_a_connection_is_refused_naming_its_type_only(call, conn):
    with pytest.raises(TypeError, match=rf"outbox\.\w+ conn= got a {type(conn).__name__}; valid: a psycopg "
                                        r"\(version 3\) Connection") as raised:
        call(conn)
    assert SECRET not in str(raised.value)


@pytest.mark.parametrize(("arguments", "says"), [
    ({"task_name": "a\x00b"}, r"outbox task_name='a\\x00b' contains NUL .*; valid: a registered task name"),
    ({"task_name": "   "}, r"outbox task_name='   ' is only whitespace; valid: a registered task name"),
    ({"task_name": "ship\ud800"}, r"outbox task_name='ship\\ud800' cannot be encoded in UTF-8.*; valid: a registered"),
    ({"queue": "q\x00"}, r"outbox queue='q\\x00' contains NUL .*; valid: a queue name"),
    ({"queue": " \t"}, r"outbox queue=' \\t' is only whitespace; valid: a queue name"),
])
def test_enqueue_refuses_a_task_name_or_queue_postgresql_or_a_broker_cannot_take_naming_it(
        outbox_dsn, arguments, says):
    """NUL raised psycopg's DataError naming no argument (and aborted the caller's transaction);
    whitespace was stored."""
    arguments = {"task_name": "shop.ship", **arguments}
    with psycopg.connect(outbox_dsn) as conn:
        conn.execute("INSERT INTO caller VALUES ('kept')")
        with pytest.raises(ValueError, match=says):
            outbox.enqueue(conn, arguments.pop("task_name"), [1], **arguments)
        conn.commit()
    assert count(outbox_dsn, "SELECT count(*) FROM taskherd_outbox") == 0
    assert count(outbox_dsn, "SELECT count(*) FROM caller") == 1


@pytest.mark.parametrize("examples", [-1, "5", None, True, 1.5])
def test_status_refuses_examples_that_is_not_an_int_at_least_0(outbox_dsn, examples):
    with psycopg.connect(outbox_dsn) as conn:
        conn.execute("INSERT INTO caller VALUES ('kept')")
        with pytest.raises(ValueError, match=rf"outbox.status examples={examples!r}; valid: an int >= 0"):
            outbox.status(conn, examples=examples)
        conn.commit()
    assert count(outbox_dsn, "SELECT count(*) FROM caller") == 1


def test_status_with_no_examples(outbox_dsn):
    with psycopg.connect(outbox_dsn) as conn:
        assert outbox.status(conn, examples=0).refused_examples == []


def outbox_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "taskherd.cli", "outbox", *args], env=python_env(env),
                          cwd=TESTS_DIR, capture_output=True, text=True, timeout=60)


NOT_A_DSN = f"mysql://u:{SECRET}@127.0.0.1/db"


@pytest.mark.parametrize(("args", "env", "source"), [
    (["status", "--dsn", NOT_A_DSN], {}, "--dsn"),
    (["migrate", "--dsn", NOT_A_DSN], {}, "--dsn"),
    (["relay", "--dsn", NOT_A_DSN, "-b", "redis://127.0.0.1:1/0"], {}, "--dsn"),
    (["status"], {"TASKHERD_OUTBOX_DSN": NOT_A_DSN}, "TASKHERD_OUTBOX_DSN"),
    (["status"], {"TASKHERD_OUTBOX_DSN": "", "DATABASE_URL": NOT_A_DSN}, "DATABASE_URL"),
    (["status", "--dsn", f"host=127.0.0.1 password='{SECRET} x' nonsense"], {}, "--dsn"),
    (["status", "--dsn", f"host=127.0.0.1 password={SECRET} port=1 nonsense"], {}, "--dsn"),
])
def test_a_dsn_that_does_not_parse_is_refused_without_printing_its_password(args, env, source):
    """The flag was shown redacted, but libpq's reason repeated the raw string:
    missing "=" after "mysql://u:s3cr3t@…"."""
    refused = outbox_cli(*args, env=env)
    assert refused.returncode == 2 and f"{source}=" in refused.stderr and "is not a PostgreSQL DSN" in refused.stderr, \
        refused
    assert SECRET not in refused.stdout + refused.stderr, refused.stderr


@pytest.mark.parametrize(("suffix", "says"), [
    ("?sslmode=bogus", "sslmode='bogus' is not one of disable, allow, prefer, require, verify-ca, verify-full"),
    ("?target_session_attrs=writable", "target_session_attrs='writable' is not one of any, read-write"),
    ("?connect_timeout=soon", "connect_timeout='soon' is not an integer"),  # was a traceback
])
def test_a_dsn_option_libpq_refuses_before_connecting_is_a_usage_error_naming_dsn(suffix, says):
    """Was exit 1 "cannot use the database: … invalid sslmode value": a usage problem classed as
    the environment's."""
    refused = outbox_cli("status", "--dsn", SECRET_DSN.replace(":1/", ":5432/") + suffix)
    assert refused.returncode == 2, refused
    assert "--dsn='postgresql://shop:***@127.0.0.1:5432/shop" in refused.stderr and says in refused.stderr, refused
    assert SECRET not in refused.stderr and "Traceback" not in refused.stderr, refused.stderr


@pytest.mark.parametrize("dsn", [f"postgresql://shop:{SECRET}@127.0.0.1:abc/shop",
                                 f"host=127.0.0.1 port=99999 password={SECRET}",
                                 f"postgresql://shop:{SECRET}@h1:5432,h2:x/shop"])
def test_a_port_that_is_not_a_port_is_a_usage_error_naming_dsn(dsn):
    refused = outbox_cli("migrate", "--dsn", dsn)
    assert refused.returncode == 2 and "--dsn=" in refused.stderr and "is not a port number (valid: 1..65535" \
        in refused.stderr, refused
    assert SECRET not in refused.stderr, refused.stderr


@pytest.mark.parametrize("text", [
    f'missing "=" after "{NOT_A_DSN}" in connection info string',
    f"connection to server failed for host=127.0.0.1 password={SECRET} dbname=x",
    f"connection to server failed for host=127.0.0.1 password='{SECRET} and more' dbname=x",
    f"the server said: {SECRET}",  # the DSN's own password, wherever a message repeats it
])
def test_every_error_the_command_prints_hides_the_password(text):
    """The one line every print path of the command uses (OperationalError, InsufficientPrivilege,
    PreconditionFailed, the DSN's parse) is redacted."""
    said = outbox_command._one_line(Exception(text), f"host=127.0.0.1 password={SECRET}")
    assert SECRET not in said and "***" in said, said
