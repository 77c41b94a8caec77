"""The Celery app bench/worker_boot.py boots: bench/cluster_app.py's app (configure(app), as a user's
app and the scale-up benchmark's pods do), or with WORKER_BOOT_VANILLA=1 the same app without
configure() (the vanilla Celery baseline), instrumented to report where its boot went.
WORKER_BOOT_WITHOUT (component class names, comma-separated) leaves those default components out,
to measure what one costs.

At each mark it takes the wall clock and the main process's CPU time (user + system, all threads);
when the worker is ready it adds the CPU time of its pool children and the modules loaded, and
writes the lot as JSON to $WORKER_BOOT_REPORT. Only os and time are imported before the marks are
taken, and nothing is written before the worker is ready, so measuring does not move the figures.
"""
import os
import time

MARKS: dict[str, tuple[float, float]] = {"import_started": (time.time(), time.process_time())}


def mark(name: str) -> None:
    MARKS.setdefault(name, (time.time(), time.process_time()))


from celery import Celery, bootsteps, signals  # noqa: E402

mark("celery_imported")
VANILLA = os.environ.get("WORKER_BOOT_VANILLA") == "1"

# configure() reads the broker URL from the pod's environment; vanilla Celery is told it.
app = Celery("worker_boot_app", broker=os.environ.get("TASKHERD_BROKER_URL"))
app.conf.broker_connection_retry_on_startup = True
if not VANILLA:
    from taskherd.worker import configure

    mark("taskherd_imported")
    left_out = [name for name in os.environ.get("WORKER_BOOT_WITHOUT", "").split(",") if name]
    components = None
    if left_out:
        from taskherd.worker.components import default_components

        components = [c for c in default_components() if type(c).__name__ not in left_out]
    configure(app, components=components)
mark("configured")


@signals.worker_init.connect
def _on_worker_init(**_):
    mark("worker_init")


class _PoolStarted(bootsteps.StartStopStep):
    """Starts right after the pool's children are forked (the worker's blueprint orders it so)."""

    requires = ("celery.worker.components:Pool",)

    def start(self, worker):
        mark("pool_started")


app.steps["worker"].add(_PoolStarted)


def _children_cpu_seconds() -> tuple[int, float]:
    """(number of child processes, their CPU seconds so far) from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    count, total = 0, 0.0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as f:
                children = f.read().split()
        except OSError:
            continue
        for pid in children:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            count += 1
            total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return count, total


@signals.worker_ready.connect
def _on_worker_ready(**_):
    mark("ready")
    children, children_cpu = _children_cpu_seconds()
    import json
    import sys

    packages: dict[str, int] = {}
    for name in list(sys.modules):
        top = name.split(".", 1)[0]
        packages[top] = packages.get(top, 0) + 1
    report = {"marks": MARKS, "children": children, "children_cpu": children_cpu,
              "modules": sorted(sys.modules), "packages": packages}
    path = os.environ["WORKER_BOOT_REPORT"]
    with open(path + ".tmp", "w") as f:
        json.dump(report, f)
    os.replace(path + ".tmp", path)


@app.task(name="worker_boot.noop", ignore_result=True)
def noop() -> None:
    return None
