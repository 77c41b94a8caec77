"""`taskherd worker`: a real worker started without Celery's command line, and what it hands back to it."""
import subprocess
import sys

from celery import Celery

from e2e.lib.waiting import wait_for
from support.worker_process import WorkerProcess
from taskherd.commands import worker as worker_command


class TaskherdWorker(WorkerProcess):
    """The same worker process, started by `taskherd worker` (with -X importtime on its stderr)."""

    def __init__(self, *args, options: list[str], **kwargs):
        super().__init__(*args, **kwargs)
        self.options = options

    def command(self) -> list[str]:
        return [sys.executable, "-X", "importtime", "-m", "taskherd.cli", "worker", "-A", self.app_module,
                "--queues", ",".join(self.queues), "--concurrency", str(self.concurrency), "--loglevel", "INFO",
                "--hostname", self.hostname, "--without-mingle", "--without-gossip", *self.options]


def imported(log: str) -> set[str]:
    """Modules in the -X importtime lines (those imported by `import` statements: importlib's own
    import_module is not timed)."""
    return {line.rsplit("|", 1)[1].strip() for line in log.splitlines() if "import time:" in line}


def test_runs_tasks_without_importing_celerys_command_line(redis_url, unique_name, tmp_path):
    env = {"TEST_BROKER_URL": redis_url, "TEST_LEDGER_URL": redis_url, "TEST_QUEUE": unique_name}
    worker = TaskherdWorker("apps.runtime_app", log_dir=tmp_path, queues=[unique_name], env=env,
                            options=["--time-limit", "50", "--soft-time-limit", "40"])
    try:
        worker.start()
        producer = Celery(broker=redis_url)
        producer.send_task("runtime.sleep", args=("one", 0.1), queue=unique_name)
        producer.close()
        import redis

        ledger = redis.Redis.from_url(redis_url)
        wait_for("the task run by taskherd worker", lambda: b"one" in ledger.lrange("done", 0, -1), timeout=30)
        log = worker.log()
        assert "concurrency: 2 (prefork)" in log and f".> {unique_name}" in log
        modules = imported(log)
        assert "celery.worker.consumer.consumer" in modules  # the listing covers the worker's own imports
        assert not {"celery.bin.celery", "click_repl", "prompt_toolkit"} & modules, \
            sorted({"celery.bin.celery", "click_repl", "prompt_toolkit"} & modules)
    finally:
        worker.kill()


def test_an_option_it_does_not_know_goes_to_celerys_command_line(redis_url, unique_name, tmp_path):
    env = {"TEST_BROKER_URL": redis_url, "TEST_LEDGER_URL": redis_url, "TEST_QUEUE": unique_name}
    worker = TaskherdWorker("apps.runtime_app", log_dir=tmp_path, queues=[unique_name], env=env,
                            options=["--autoscale=2,1"])
    try:
        worker.start()
        log = worker.log()
        assert "'--autoscale=2,1' is not one of its options: running Celery's command line" in log
        assert "celery.bin.celery" in imported(log)
    finally:
        worker.kill()


def test_a_bad_value_is_refused_naming_the_option(capsys):
    assert worker_command.main(["-A", "apps.runtime_app", "--concurrency", "zero"]) == 2
    assert "taskherd worker: --concurrency='zero' is not an integer" in capsys.readouterr().err
    assert worker_command.main(["--queues", "q"]) == 2
    assert "--app is required" in capsys.readouterr().err


def test_help_lists_the_options():
    done = subprocess.run([sys.executable, "-m", "taskherd.cli", "worker", "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "--without-mingle" in done.stdout and "Celery's own command line" in done.stdout
