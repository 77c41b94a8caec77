"""What the reliability profile costs per task, piece by piece, in CPU, without a broker's noise.

bench/throughput.py measures the whole worker against a broker; on this machine its CPU per task
moves by ±15 % between rounds of the same variant, more than most of the profile's pieces cost.
This benchmark times, in one process on the CPU clock, the per-task code each piece adds:

- pool child: Celery's tracer running a no-op task (``build_tracer``, what a prefork child runs
  per task), for vanilla Celery with the profile's ack settings, for ``configure(app)`` with its
  default components, and for configure() without its Metrics or TaskClass components (the two that
  act in the child). Each variant runs in a process of its own: Celery's signals are global, so
  a vanilla app in a process where configure() ran would pay for taskherd's receivers.
- main process: the bad-message checks (BadMessages: headers, body shape, arguments against the
  signature) on a well-formed message, beside the body decode Celery does on every message anyway.

Medians of `--rounds` rounds of `--tasks` tasks, variants alternating within each round.

    .venv/bin/python bench/profile_cost.py [--tasks 5000] [--rounds 7]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

from app_variants import configure_without, make_vanilla

#: variant -> components of configure() left out (None: vanilla Celery, no configure())
VARIANTS: dict[str, tuple[str, ...] | None] = {
    "vanilla": None,
    "profile": (),
    "profile without Metrics": ("Metrics",),
    "profile without TaskClass": ("TaskClass",),
    "profile without both": ("Metrics", "TaskClass"),
}
BROKER_URL = "amqp://guest@127.0.0.1//"  # never connected to: nothing here talks to a broker


def make_app(left_out: tuple[str, ...] | None):
    from celery import Celery

    app = Celery("profile_cost", broker=BROKER_URL, set_as_current=False)
    if left_out is None:
        make_vanilla(app)
    else:
        configure_without(app, left_out, queues=["q"])

    @app.task(name="profile_cost.noop", ignore_result=True)
    def noop():
        pass

    app.finalize()
    return app


def child_cpu_per_task(variant: str, tasks: int) -> float:
    """µs of CPU per no-op task in Celery's tracer, as a pool child runs it."""
    from celery.app.trace import build_tracer

    left_out = VARIANTS[variant]
    app = make_app(left_out)
    task = app.tasks["profile_cost.noop"]
    if left_out is not None and "Metrics" not in left_out:
        from taskherd.worker.components import metrics

        # What the Metrics component does at worker_init, its tasks imported, before the pool forks.
        metrics.start_recording(app, base=tempfile.mkdtemp(prefix="profile-cost-"))
    trace = build_tracer(task.name, task, app=app, eager=False, propagate=False)
    requests = []
    for _ in range(tasks + tasks // 10):
        task_id = str(uuid.uuid4())
        requests.append((task_id, {
            "id": task_id, "task": task.name, "retries": 0, "hostname": "bench", "is_eager": False,
            "delivery_info": {"redelivered": False, "exchange": "", "routing_key": "q"},
            "headers": {"taskherd_published_at": time.time()}, "taskherd_published_at": time.time()}))
    for task_id, request in requests[tasks:]:  # warm-up: first labels, files, caches
        trace(task_id, [], {}, request)
    started = time.process_time()
    for task_id, request in requests[:tasks]:
        trace(task_id, [], {}, request)
    return (time.process_time() - started) / tasks * 1e6


def message_check_cpu(tasks: int) -> tuple[float, float]:
    """(µs per message of the bad-message checks, µs of the body decode alone) on well-formed messages."""
    from kombu import Message
    from kombu.serialization import prepare_accept_content

    from taskherd.worker.components.bad_messages import verdict_on

    app = make_app(())
    task_message = app.amqp.as_task_v2(str(uuid.uuid4()), "profile_cost.noop", args=(), kwargs={})
    headers = {**task_message.headers, "taskherd_published_at": time.time()}
    body = json.dumps(task_message.body).encode()
    accepted = set(prepare_accept_content(app.conf.accept_content))

    def messages():
        return [Message(body=body, content_type="application/json", content_encoding="utf-8", headers=headers,
                        delivery_info={"redelivered": False, "routing_key": "q", "exchange": ""})
                for _ in range(tasks)]

    batch = messages()
    started = time.process_time()
    for message in batch:
        if verdict_on(message, accepted=accepted, tasks=app.tasks) is not None:
            raise SystemExit("a well-formed message was refused: the benchmark's message is wrong")
    checks = (time.process_time() - started) / tasks * 1e6
    batch = messages()
    started = time.process_time()
    for message in batch:
        message.decode()
    return checks, (time.process_time() - started) / tasks * 1e6


def run_child(variant: str, tasks: int) -> dict[str, float]:
    output = subprocess.run([sys.executable, __file__, "--child", variant, "--tasks", str(tasks)],
                            check=True, capture_output=True, text=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.tasks < 100 or args.rounds < 1:
        parser.error(f"--tasks {args.tasks} --rounds {args.rounds}: valid are --tasks >= 100 (fewer are below the "
                     "CPU clock's resolution) and --rounds >= 1")
    if args.child == "message checks":
        checks, decode = message_check_cpu(args.tasks)
        print(json.dumps({"checks": checks, "decode": decode}))
        return 0
    if args.child:
        print(json.dumps({"trace": child_cpu_per_task(args.child, args.tasks)}))
        return 0

    traced: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    checks: list[float] = []
    decodes: list[float] = []
    for round_ in range(args.rounds):
        order = list(VARIANTS) if round_ % 2 == 0 else list(VARIANTS)[::-1]
        for variant in order:
            traced[variant].append(run_child(variant, args.tasks)["trace"])
        figures = run_child("message checks", args.tasks)
        checks.append(figures["checks"])
        decodes.append(figures["decode"])
        print(f"  round {round_ + 1}: " + ", ".join(f"{variant} {traced[variant][-1]:.1f}" for variant in VARIANTS)
              + f"; message checks {checks[-1]:.1f} (decode {decodes[-1]:.1f}) us", flush=True)

    base = statistics.median(traced["vanilla"])
    print(f"\nCPU per no-op task, µs, median of {args.rounds} rounds of {args.tasks} tasks "
          f"(load average {os.getloadavg()[0]:.1f})")
    print(f"{'pool child: Celery tracer':<40}{'us/task':>10}{'vs vanilla':>12}")
    for variant in VARIANTS:
        median = statistics.median(traced[variant])
        print(f"{variant:<40}{median:>10.1f}{median - base:>+11.1f}")
    check, decode = statistics.median(checks), statistics.median(decodes)
    print(f"{'main process: bad-message checks':<40}{check:>10.1f}{check - decode:>+11.1f}"
          f"  (includes the body decode Celery does anyway: {decode:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
