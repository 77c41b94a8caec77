"""-A/--app as the commands load it, in real `taskherd` processes: a spec that names no app is a usage
error in one line (exit 2); a module that raises while it is imported is the user's own error, shown
first and whole, then its traceback, with no "valid: a module path" hint (exit 1). No broker is
reached: every case ends before one is (the modules' broker listens nowhere).

Also `taskherd recover` on a Redis whose workers registered under another global key prefix (real Redis)."""
import os
import subprocess
import sys
import textwrap

import pytest

TASKHERD = [sys.executable, "-m", "taskherd.cli"]
HINT = "valid: a module path"

MODULES = {
    "th_raises_at_import": """
        from celery import Celery
        app = Celery("th_raises_at_import", broker="redis://127.0.0.1:1/0", set_as_current=False)
        PORT = int("not-a-number")
    """,
    "th_bad_profile": """
        from celery import Celery
        from taskherd.worker import configure
        app = Celery("th_bad_profile", broker="redis://127.0.0.1:1/0", set_as_current=False)
        configure(app, queues=["b"], soft_time_limit=60, time_limit=30)
    """,
    "th_missing_dependency": """
        import a_dependency_that_is_not_installed
    """,
    "th_good": """
        from celery import Celery
        app = Celery("th_good", broker="redis://127.0.0.1:1/0", set_as_current=False)
    """,
}

#: the command lines under test, each ending before a broker is reached
COMMANDS = {
    "worker": ["worker", "-Q", "b"],
    "ping": ["ping", "-Q", "b", "--timeout", "1"],
    "outbox relay": ["outbox", "relay", "--dsn", "postgresql://nobody@127.0.0.1:1/none", "--once"],
}


@pytest.fixture
def app_dir(tmp_path):
    for name, source in MODULES.items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    return tmp_path


def run(app_dir, command: str, spec: str) -> subprocess.CompletedProcess:
    env = {name: value for name, value in os.environ.items() if not name.startswith("TASKHERD_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(app_dir), env.get("PYTHONPATH")]))
    argv = COMMANDS[command]
    at = 2 if command == "outbox relay" else 1
    argv = [*argv[:at], "-A", spec, *argv[at:]]
    return subprocess.run([*TASKHERD, *argv], capture_output=True, text=True, timeout=90, env=env,
                          cwd=str(app_dir))


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("spec,message,last_line", [
    ("th_raises_at_import", "invalid literal for int() with base 10: 'not-a-number'",
     "ValueError: invalid literal for int() with base 10: 'not-a-number'"),
    ("th_raises_at_import:app", "invalid literal for int() with base 10: 'not-a-number'",
     "ValueError: invalid literal for int() with base 10: 'not-a-number'"),
    ("th_bad_profile", "invalid taskherd reliability profile: soft_time_limit=60 must be less than time_limit=30",
     "taskherd.worker.profile.ProfileError: invalid taskherd reliability profile: soft_time_limit=60"),
    ("th_missing_dependency:app", "No module named 'a_dependency_that_is_not_installed'",
     "ModuleNotFoundError: No module named 'a_dependency_that_is_not_installed'"),
])
def test_an_error_raised_while_importing_the_app_is_the_users_own_with_its_traceback(app_dir, command, spec,
                                                                                    message, last_line):
    result = run(app_dir, command, spec)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    # first and whole: the user's message right after the command's name, not kombu's "Couldn't import"
    assert lines[0].startswith(f"taskherd {command}: {message}"), result.stderr
    assert f"raised while importing -A/--app={spec!r}" in lines[1], result.stderr
    assert "Traceback (most recent call last):" in result.stderr
    assert f'{spec.partition(":")[0]}.py", line' in result.stderr  # the frame of the user's module
    assert lines[-1].startswith(last_line), result.stderr
    assert HINT not in result.stderr and "Couldn't import" not in result.stderr, result.stderr


def test_a_profile_error_is_shown_whole(app_dir):
    result = run(app_dir, "worker", "th_bad_profile")
    first = result.stderr.splitlines()[0]
    whole = result.stderr.strip().splitlines()[-1].partition("ProfileError: ")[2]
    assert whole.startswith("invalid taskherd reliability profile: ") and "the soft limit" in whole
    assert first == f"taskherd worker: {whole}"


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("spec,says", [
    ("th_no_such_module", "-A/--app='th_no_such_module': no module named 'th_no_such_module'"),
    ("th_no_such_package.celery", "no module named 'th_no_such_package'"),
    ("th_good:nope", "-A/--app='th_good:nope': module 'th_good' has no attribute 'nope'"),
    ("os", "module 'os' has no Celery app"),
    (":app", "-A/--app=':app': no module before ':'"),
    ("th_good:app:x", "-A/--app='th_good:app:x': more than one ':'"),
])
def test_a_spec_that_names_no_app_is_a_usage_error_in_one_line(app_dir, command, spec, says):
    result = run(app_dir, command, spec)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [result.stderr.strip()], result.stderr  # one line
    assert result.stderr.startswith(f"taskherd {command}: ") and says in result.stderr, result.stderr
    assert HINT in result.stderr and "Traceback" not in result.stderr


# -- recover: workers registered under another global key prefix -----------------------------------
def _register_dead_worker(client, prefix: str, worker_id: str) -> None:
    """A worker registered for fast recovery whose lease has lapsed (no alive key), as recovery.py keeps it."""
    from taskherd.worker.components.recovery import WORKERS_KEY

    client.sadd(prefix + WORKERS_KEY, worker_id)


def test_recover_without_the_prefix_the_workers_use_says_so_naming_it(redis_url, capsys):
    import json

    import redis

    from taskherd.commands import recover

    client = redis.Redis.from_url(redis_url)
    try:
        _register_dead_worker(client, "shop:", "celery@h.1.dead0001")
        assert recover.main(["-b", redis_url]) == 0
        out, err = capsys.readouterr()
        assert json.loads(out)["restored"] == {}
        assert err.startswith("taskherd recover: warning: no taskherd worker is registered on this Redis with "
                              "no --global-keyprefix; workers are registered with --global-keyprefix='shop:'"), err
        assert len(err.strip().splitlines()) == 1

        # a mistyped prefix: the one in use is named, the one given too
        assert recover.main(["-b", redis_url, "--global-keyprefix", "shop"]) == 0
        err = capsys.readouterr().err
        assert "with --global-keyprefix='shop'; workers are registered with --global-keyprefix='shop:'" in err

        # the right prefix: the dead worker is restored, nothing to warn of
        assert recover.main(["-b", redis_url, "--global-keyprefix", "shop:"]) == 0
        out, err = capsys.readouterr()
        assert json.loads(out)["restored"] == {"celery@h.1.dead0001": 0} and err == "", (out, err)
    finally:
        client.close()


def test_recover_is_silent_when_no_worker_is_registered_anywhere(redis_url, capsys):
    from taskherd.commands import recover

    assert recover.main(["-b", redis_url]) == 0
    assert capsys.readouterr().err == ""


def test_recover_watch_looks_for_other_prefixes_once_per_recheck_not_every_pass(redis_url, monkeypatch, capsys):
    """With no worker under its own prefix, the look for others is a SCAN of the whole keyspace: a
    --watch of every 0.01 s must not make one each pass."""
    import redis

    from taskherd.commands import recover

    looks, passes = [], []

    class Stop(Exception):
        pass

    def sleep(_seconds):
        passes.append(1)
        if len(passes) == 20:
            raise Stop

    real_mismatch = recover.prefix_mismatch
    monkeypatch.setattr(recover, "prefix_mismatch", lambda *a, **k: looks.append(1) or real_mismatch(*a, **k))
    monkeypatch.setattr(recover.time, "sleep", sleep)
    client = redis.Redis.from_url(redis_url)
    try:
        _register_dead_worker(client, "shop:", "celery@h.1.dead0002")
        with pytest.raises(Stop):
            recover.main(["-b", redis_url, "--watch", "0.01"])
        out, err = capsys.readouterr()
        assert len(out.splitlines()) == 20 and len(looks) == 1, "20 passes, one look"
        assert len(err.strip().splitlines()) == 1 and "--global-keyprefix='shop:'" in err, err
    finally:
        client.close()
