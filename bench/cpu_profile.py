"""python bench/cpu_profile.py OUT -m celery ...: runs celery under cProfile on a CPU clock
(time.process_time), from the worker's readiness to its exit, and writes the pstats to OUT — so that
neither the boot nor the other processes of a loaded machine enter the figures.
Used by ``throughput.py --profile --profiler cprofile`` (solo pool: one process does everything)."""
import atexit
import cProfile
import runpy
import sys
import time

out = sys.argv[1]
if sys.argv[2:3] != ["-m"] or len(sys.argv) < 4:
    raise SystemExit(__doc__)
module, sys.argv = sys.argv[3], sys.argv[3:]
profiler = cProfile.Profile(time.process_time)

from celery import signals  # noqa: E402 - after the arguments are checked


@signals.worker_ready.connect(weak=False)
def _start(**_):
    profiler.enable()


@atexit.register
def _dump():
    profiler.disable()
    profiler.dump_stats(out)


runpy.run_module(module, run_name="__main__", alter_sys=True)
