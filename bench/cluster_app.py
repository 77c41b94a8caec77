"""The Celery app the cluster benchmarks deploy (bench/cluster_bench.py): configure(app) as a user's
app does, plus what the benchmarks read back from a Redis ledger (BENCH_LEDGER_URL, else the broker).

- Boot timestamps (bench/scaleup.py): each pod records, in the hash ``boot:<POD_NAME>`` (epoch
  seconds, the host's clock: the local cluster shares it), when its process started, when this
  module began importing and was configured, when Celery's worker_init fired, when the consumer
  was connected to the broker, when the worker was ready, and when it started its first task.
  They are kept in memory and written once the worker is ready, so measuring does not slow the boot.
- ``cluster.hold`` (bench/pod_kill.py) appends ``{"pod", "pid", "at"}`` to ``starts:<token>`` each time it
  starts, then sleeps.
"""
import os
import time

_IMPORT_STARTED = time.time()


def _process_started() -> float:
    """This process's start time: /proc/self/stat (clock ticks after boot) + the boot time."""
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/stat") as f:
        boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
    return boot + ticks / os.sysconf("SC_CLK_TCK")


from celery import Celery, bootsteps, signals  # noqa: E402

from taskherd.worker import configure  # noqa: E402

app = Celery("cluster_app")
app.conf.broker_connection_retry_on_startup = True
configure(app)

POD = os.environ.get("POD_NAME", "local")
BOOT: dict[str, float] = {"process_started": _process_started(), "import_started": _IMPORT_STARTED,
                          "configured": time.time()}


_client = None


def _ledger():
    global _client
    if _client is None:
        import redis

        _client = redis.Redis.from_url(os.environ.get("BENCH_LEDGER_URL") or os.environ["TASKHERD_BROKER_URL"])
    return _client


@signals.worker_init.connect
def _on_worker_init(**_):
    BOOT["worker_init"] = time.time()


class _Connected(bootsteps.StartStopStep):
    """Starts right after the consumer's broker connection is established."""

    requires = ("celery.worker.consumer.connection:Connection",)

    def start(self, consumer):
        BOOT.setdefault("connected", time.time())


app.steps["consumer"].add(_Connected)


@signals.worker_ready.connect
def _on_worker_ready(**_):
    BOOT["worker_ready"] = time.time()
    _ledger().hset(f"boot:{POD}", mapping=BOOT)


@app.task(name="cluster.work", ignore_result=True)
def work(seconds: float) -> None:
    _ledger().hsetnx(f"boot:{POD}", "first_task", time.time())
    time.sleep(seconds)


@app.task(name="cluster.hold", ignore_result=True)
def hold(token: str, seconds: float) -> None:
    import json

    _ledger().rpush(f"starts:{token}", json.dumps({"pod": POD, "pid": os.getpid(), "at": time.time()}))
    time.sleep(seconds)
