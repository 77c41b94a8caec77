"""Autoscaling judged on traces: taskherd's operator vs KEDA + HPA (defaults, and KEDA tuned).

Three arrival traces replayed through one model of a worker pool (bench/tracesim.py): the same
tasks, the same pod start times (drawn from what bench/scaleup.py measured on the local cluster:
scale call -> pod Ready and taking tasks), the same pool (concurrency 2 per pod, target 5
messages per pod, at most 40 pods). Scalers:

- **taskherd**: the real `taskherd.operator.scaling.desired_replicas` every pollIntervalSeconds
  (5 s, random phase), with the pool's maxOldestMessageAgeSeconds (30 s) and the busy pods the
  operator reads from the workers' metrics; scale-down removes idle pods first (pod-deletion-cost).
  "+ Little's law" also reads the workers' finished-task counters, at the polls where the
  operator reads them (`taskherd.operator.throughput.reading_due`). Between polls the operator's
  early notice counts the ready messages every second (Redis: LLEN; RabbitMQ: a passive
  queue.declare over AMQP; the real `taskherd.operator.early_notice.outgrows`) and, when they outgrow the pool, polls on the
  scheduler's next tick (0.25 s); "no early" is the operator before it.
- **KEDA + HPA, defaults**, modelled from their source (kedacore/keda pkg/scalers,
  kubernetes pkg/controller/podautoscaler): KEDA polls its scaler every `pollingInterval` (30 s)
  and alone does 0 -> 1 (activation: metric > activationValue 0) and N -> 0 (not active for
  `cooldownPeriod`, 300 s); in between the HPA syncs every 15 s (controller-manager default, not a
  KEDA setting), asks KEDA's metrics server for the value (queried live), and with an AverageValue
  target sets ceil(metric / target) unless |metric / (target x replicas) - 1| <= 0.1; scale-up at
  most max(+100 %, +4 pods) per 15 s, scale-down to the highest recommendation of the last 300 s.
  The ReplicaSet removes the youngest pods first, busy or not (a busy one drains).
  The metric depends on the scaler: Redis `listLength` is LLEN, ready messages only; RabbitMQ
  `QueueLength` over the management API (protocol http) counts ready + unacknowledged by default
  (`excludeUnacknowledged: false`), over AMQP (passive queue.declare) ready only.
- **taskherd, 1 s polls**: `pollIntervalSeconds: 1` (the CRD's minimum), for a pool whose queue
  wait matters more than the operator's CPU (five times the polls).
- **KEDA tuned**: `pollingInterval: 5`; everything else as the defaults (the HPA's sync period is
  the cluster's, not the ScaledObject's).

Reported per trace and scaler, medians over --runs runs (random poll phases and pod start draws):
p50 and p99 queue wait (arrival -> start), replica-seconds (scale call -> pod gone), the share of
tasks that waited longer than the pool's age limit (the SLO, 30 s) and the peak replicas.
Target: on the burst trace, taskherd's p99 wait <= 1/5 of KEDA-default's at no more
replica-seconds.

    .venv/bin/python bench/autoscaling.py [--runs 10] [--starts FILE] [--traces burst,diurnal,spiky]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from repo_paths import ROOT  # first: the shared helpers below live in the repository

from tracesim import IDLE_FIRST, NEWEST_FIRST, Result, Simulation, Trace, View

from taskherd.operator.early_notice import PROBE_SECONDS, outgrows
from taskherd.operator.policy import ScalingPolicy
from taskherd.operator.scaling import (THROUGHPUT_WINDOW_SECONDS, Observation, Recommendation,
                                       WorkSample, desired_replicas, estimate_throughput, prune_history)
from taskherd.operator.scheduler import TICK_SECONDS
from taskherd.operator.throughput import reading_due

CONCURRENCY = 2
TARGET_PER_POD = 5
MAX_PODS = 40
AGE_LIMIT = 30.0
DOWN_WINDOW = 300.0
#: pod start samples committed from a measured run, used when bench/scaleup.py has not run here
COMMITTED_STARTS = ROOT / "bench" / "data" / "pod_start_seconds.json"


def measured_starts_path() -> Path:
    """Where bench/scaleup.py writes the pod start times of its last run."""
    home = Path(os.environ.get("TASKHERD_HOME") or Path.home() / ".cache" / "taskherd")
    return home / "bench" / "scaleup.json"


# -- traces -------------------------------------------------------------------------------------
def _poisson(rng: random.Random, rate_at, start: float, end: float, peak_rate: float) -> list[float]:
    """Arrival times of a non-homogeneous Poisson process (thinning)."""
    times, t = [], start
    while True:
        t += rng.expovariate(peak_rate)
        if t >= end:
            return times
        if rng.random() * peak_rate <= rate_at(t):
            times.append(t)


def _lognormal(rng: random.Random, mean: float, sigma: float) -> float:
    return rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma)


def burst_trace(rng: random.Random) -> Trace:
    """Quiet, then 400 one-second tasks within 10 s, twice: a batch job or a newsletter."""
    arrivals = []
    for at in (120.0, 1200.0):
        arrivals += [at + rng.uniform(0, 10) for _ in range(400)]
    arrivals += _poisson(rng, lambda t: 0.05, 0, 2100, 0.05)
    arrivals.sort()
    return Trace("burst", arrivals, [_lognormal(rng, 1.0, 0.5) for _ in arrivals], 2100.0,
                 "400 tasks (1 s) in 10 s at t=120 s and t=1200 s, 0.05/s between; min 0 pods")


def diurnal_trace(rng: random.Random) -> Trace:
    """A day compressed into two hours: 0.5/s at night, 12/s at the peak."""
    period = 7200.0

    def rate(t: float) -> float:
        return 0.5 + 11.5 * (1 - math.cos(2 * math.pi * t / period)) / 2

    arrivals = _poisson(rng, rate, 0, period, 12.0)
    return Trace("diurnal", arrivals, [_lognormal(rng, 1.5, 0.6) for _ in arrivals], period,
                 "0.5/s -> 12/s -> 0.5/s over 2 h, 1.5 s tasks; min 1 pod")


def spiky_trace(rng: random.Random) -> Trace:
    """2/s with 30 s spikes at 8x every 4-8 min; Pareto task durations (heavy tail, up to 300 s)."""
    spikes, t = [], 0.0
    while t < 3600:
        t += rng.uniform(240, 480)
        spikes.append(t)

    def rate(at: float) -> float:
        return 16.0 if any(s <= at < s + 30 for s in spikes) else 2.0

    arrivals = _poisson(rng, rate, 0, 3600, 16.0)
    services = [min(300.0, 0.4 * rng.paretovariate(1.5)) for _ in arrivals]
    return Trace("spiky", arrivals, services, 3600.0,
                 "2/s, 30 s spikes at 16/s every 4-8 min, Pareto(1.5) durations, mean 1.2 s; min 1 pod")


TRACES = {"burst": (burst_trace, 0), "diurnal": (diurnal_trace, 1), "spiky": (spiky_trace, 1)}


# -- scalers ------------------------------------------------------------------------------------
@dataclass
class Taskherd:
    """The operator's poll loop around the real decision function; with `throughput`, it also
    reads the workers' counters (completed tasks, their summed runtime) and passes Little's law
    inputs (taskherd.operator.scaling.estimate_throughput)."""

    policy: ScalingPolicy
    throughput: bool = True
    poll_seconds: float = 5.0
    name: str = "taskherd"
    removal: str = IDLE_FIRST
    #: count the ready messages between polls (early_notice.py), as the operator does on both brokers
    early_notice: bool = True
    history: list[Recommendation] = field(default_factory=list)
    samples: list[WorkSample] = field(default_factory=list)
    next_poll: float = 0.0
    poll_now: bool = False

    def first_poll(self, rng: random.Random) -> float:
        # An operator that has watched the pool for a while: its history covers the scale-down
        # window (a freshly started one holds any scale-down for one window, on purpose).
        window = self.policy.scale_down_stabilization_seconds
        self.history = [Recommendation(-window - self.poll_seconds, self.policy.min_replicas)]
        return rng.uniform(0, self.poll_seconds)

    def observe(self, view: View) -> Observation:
        observation = Observation(ready=view.ready_messages, unacked=view.unacked_messages,
                                  oldest_message_age_seconds=view.oldest_ready_age)
        if not self.throughput:
            return observation
        # The workers are read when the operator would read them (throughput.reading_due, on its
        # decision before any reading): not steady, or steady with a backlog every 30 s.
        before = desired_replicas(self.policy, observation, view.replicas, 0, self.history, view.now)
        last = self.samples[-1].at if self.samples else None
        if reading_due(before, view.replicas, observation.depth, last, view.now):
            # the window for the rate, and ten more minutes in case no task finished within it
            self.samples = [s for s in self.samples if s.at >= view.now - THROUGHPUT_WINDOW_SECONDS - 600]
            self.samples.append(WorkSample(at=view.now, depth=observation.depth, completed=view.completed,
                                           busy_seconds=view.service_seconds))
        throughput = estimate_throughput(self.samples, slots_per_worker=CONCURRENCY, now=view.now)
        return dataclasses.replace(observation, throughput=throughput)

    def poll(self, view: View) -> tuple[int | None, float]:
        if self.early_notice and not self.poll_now and view.now < self.next_poll:
            return None, self._count(view)
        self.poll_now = False
        decision = desired_replicas(self.policy, self.observe(view), view.replicas, view.busy_pods,
                                    self.history, view.now)
        self.history = prune_history(self.history + [decision.recommendation], view.now,
                                     self.policy.scale_down_stabilization_seconds)
        changed = decision.replicas if decision.replicas != view.replicas else None
        self.next_poll = view.now + self.poll_seconds
        if self.early_notice:
            return changed, min(self.next_poll, view.now + PROBE_SECONDS)
        return changed, self.next_poll

    def _count(self, view: View) -> float:
        """The early notice's count between polls (early_notice.candidate's conditions); returns when
        this scaler runs next."""
        counted = self.next_poll - view.now > PROBE_SECONDS
        if counted and outgrows(view.ready_messages, view.replicas, self.policy):
            self.poll_now = True
            return view.now + TICK_SECONDS  # polled on the scheduler's next tick
        return min(self.next_poll, view.now + PROBE_SECONDS)


@dataclass
class KedaHpa:
    """KEDA's scale loop (activation, cooldown) and the HPA's sync, as in their source."""

    name: str
    polling_seconds: float = 30.0
    #: "ready" (Redis listLength, AMQP passive declare) or "ready+unacked" (RabbitMQ over HTTP)
    metric: str = "ready"
    min_replicas: int = 0
    max_replicas: int = MAX_PODS
    target: float = TARGET_PER_POD
    cooldown_seconds: float = 300.0
    hpa_sync_seconds: float = 15.0
    tolerance: float = 0.1
    down_window_seconds: float = DOWN_WINDOW
    removal: str = NEWEST_FIRST
    recommendations: list[tuple[float, int]] = field(default_factory=list)
    last_active: float = 0.0
    next_keda: float = 0.0
    next_hpa: float = 0.0

    def first_poll(self, rng: random.Random) -> float:
        self.next_keda = rng.uniform(0, self.polling_seconds)
        self.next_hpa = rng.uniform(0, self.hpa_sync_seconds)
        return min(self.next_keda, self.next_hpa)

    def value(self, view: View) -> int:
        return view.ready_messages + (view.unacked_messages if self.metric == "ready+unacked" else 0)

    def poll(self, view: View) -> tuple[int | None, float]:
        now, replicas = view.now, view.replicas
        new = replicas
        if now >= self.next_keda - 1e-9:
            self.next_keda += self.polling_seconds
            if self.value(view) > 0:  # activationValue 0
                self.last_active = now
                if new == 0:
                    new = max(self.min_replicas, 1)
            elif new > self.min_replicas and self.min_replicas == 0 and now - self.last_active >= self.cooldown_seconds:
                new = 0
        if now >= self.next_hpa - 1e-9:
            self.next_hpa += self.hpa_sync_seconds
            if new >= 1:  # the HPA is inactive at zero replicas
                new = self._hpa(now, new, self.value(view))
        return (new if new != replicas else None), min(self.next_keda, self.next_hpa)

    def _hpa(self, now: float, current: int, metric: int) -> int:
        ratio = metric / (self.target * current)
        desired = current if abs(ratio - 1) <= self.tolerance else math.ceil(metric / self.target)
        self.recommendations = [(t, r) for t, r in self.recommendations if t > now - self.down_window_seconds]
        self.recommendations.append((now, desired))
        down = max(r for _, r in self.recommendations)  # scale-down stabilisation window
        stabilised = current
        if stabilised < desired:  # scale-up window 0: the newest recommendation
            stabilised = desired
        if stabilised > down:
            stabilised = down
        limit = max(current * 2, current + 4)  # default scale-up policies per 15 s
        return max(max(self.min_replicas, 1), min(stabilised, limit, self.max_replicas))


def scalers(min_replicas: int, target: int = TARGET_PER_POD) -> list:
    policy = ScalingPolicy(min_replicas=min_replicas, max_replicas=MAX_PODS, target_depth_per_worker=target,
                           max_oldest_message_age_seconds=AGE_LIMIT, scale_down_stabilization_seconds=DOWN_WINDOW)
    return [Taskherd(policy, throughput=False, name="taskherd (depth, age)"),
            Taskherd(policy, early_notice=False, name="taskherd + L's law, no early"),
            Taskherd(policy, name="taskherd + Little's law"),
            Taskherd(policy, poll_seconds=1.0, name="taskherd + L's law, 1 s polls"),
            KedaHpa("KEDA default (Redis)", min_replicas=min_replicas, target=target),
            KedaHpa("KEDA default (RabbitMQ http)", metric="ready+unacked", min_replicas=min_replicas, target=target),
            KedaHpa("KEDA tuned 5 s (Redis)", polling_seconds=5.0, min_replicas=min_replicas, target=target)]


# -- running ------------------------------------------------------------------------------------
def load_starts(path: Path | None) -> tuple[list[float], str]:
    candidates = [path] if path else [measured_starts_path(), COMMITTED_STARTS]
    for candidate in candidates:
        if candidate and candidate.is_file():
            data = json.loads(candidate.read_text())
            starts = [float(s) for s in data["start_seconds"]]
            if not starts:
                raise SystemExit(f"{candidate}: start_seconds is empty")
            return starts, f"{candidate} ({len(starts)} pods, {data.get('measured_at', 'undated')})"
    raise SystemExit(f"no pod start times: run bench/scaleup.py on the cluster (writes {measured_starts_path()}) "
                     f"or pass --starts FILE with {{\"start_seconds\": [...]}}")


def run_once(trace: Trace, scaler, starts: list[float], seed: int, min_replicas: int) -> Result:
    rng = random.Random(seed)  # the same phases and pod start draws for every scaler of one run
    return Simulation(trace, scaler, concurrency=CONCURRENCY, initial_replicas=min_replicas,
                      start_seconds=lambda: rng.choice(starts), rng=rng).run()


FIGURES = (("p50 wait s", lambda r: r.quantile(0.50), "{:.1f}"), ("p99 wait s", lambda r: r.quantile(0.99), "{:.1f}"),
           ("replica-s", lambda r: r.replica_seconds, "{:.0f}"),
           (f"wait>{AGE_LIMIT:g}s %", lambda r: 100 * r.over(AGE_LIMIT), "{:.2f}"),
           ("peak pods", lambda r: r.peak_replicas, "{:.0f}"))


def plot(path: Path, results: dict[str, Result], *, start: float, end: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (replicas, backlog) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for name, result in results.items():
        if name == "KEDA default (RabbitMQ http)":
            continue  # on the burst it draws over KEDA default (Redis)
        times = [t for t, _ in result.replica_trace] + [end]
        counts = [r for _, r in result.replica_trace] + [result.replica_trace[-1][1]]
        replicas.step(times, counts, where="post", label=name)
        backlog.plot([t for t, _ in result.ready_trace], [r for _, r in result.ready_trace], label=name)
    replicas.set_ylabel("replicas (spec)")
    backlog.set_ylabel("ready messages")
    backlog.set_xlabel("seconds (400 one-second tasks arrive at t=120-130 s)")
    replicas.set_xlim(start, end)
    replicas.legend(fontsize=8)
    replicas.set_title("burst trace: scale-up and scale-down, one run (bench/autoscaling.py)")
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    print(f"plot written to {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--starts", type=Path, help="JSON with start_seconds (default: the last bench/scaleup.py "
                                                     "run, else the committed sample)")
    parser.add_argument("--traces", default=",".join(TRACES))
    parser.add_argument("--target-per-pod", type=int, default=TARGET_PER_POD,
                        help="targetDepthPerWorker of the pool, and KEDA's target value (the same for both)")
    parser.add_argument("--plot", type=Path, help="write a PNG of the first burst of run 1 (replicas and backlog)")
    args = parser.parse_args(argv)
    starts, source = load_starts(args.starts)
    print(f"pod start (scale call -> Ready, taking tasks): median {statistics.median(starts):.1f} s, "
          f"max {max(starts):.1f} s, from {source}")
    print(f"pool: concurrency {CONCURRENCY}/pod, target {args.target_per_pod} messages/pod, max {MAX_PODS} pods, "
          f"SLO wait <= {AGE_LIMIT:g} s; medians of {args.runs} runs")
    summary: dict[tuple[str, str], dict[str, float]] = {}
    for trace_name in args.traces.split(","):
        make_trace, min_replicas = TRACES[trace_name]
        per_scaler: dict[str, list[Result]] = {}
        description = ""
        for run in range(args.runs):
            trace = make_trace(random.Random(args.seed * 1000 + run))
            description = trace.description
            for scaler in scalers(min_replicas, args.target_per_pod):
                per_scaler.setdefault(scaler.name, []).append(
                    run_once(trace, scaler, starts, args.seed * 7919 + run, min_replicas))
        if args.plot and trace_name == "burst":
            plot(args.plot, {name: results[0] for name, results in per_scaler.items()}, start=100, end=500)
        print(f"\n{trace_name}: {description}, {len(trace.arrivals)} tasks")
        print(f"{'scaler':<30}" + "".join(f"{label:>14}" for label, _, _ in FIGURES))
        for name, results in per_scaler.items():
            medians = {label: statistics.median(f(r) for r in results) for label, f, _ in FIGURES}
            summary[(trace_name, name)] = medians
            print(f"{name:<30}" + "".join(f"{fmt.format(medians[label]):>14}" for label, _, fmt in FIGURES))
    if "burst" in args.traces.split(","):
        theirs = summary[("burst", "KEDA default (Redis)")]
        for name in ("taskherd + Little's law", "taskherd + L's law, no early", "taskherd + L's law, 1 s polls"):
            ours = summary[("burst", name)]
            ratio = theirs["p99 wait s"] / ours["p99 wait s"] if ours["p99 wait s"] > 0 else math.inf
            met = ratio >= 5 and ours["replica-s"] <= theirs["replica-s"]
            print(f"burst target ({name}): p99 wait <= 1/5 of KEDA default's at no more replica-seconds: "
                  f"{'MET' if met else 'MISSED'} (p99 {ours['p99 wait s']:.1f} s vs {theirs['p99 wait s']:.1f} s, "
                  f"{ratio:.1f}x; replica-s {ours['replica-s']:.0f} vs {theirs['replica-s']:.0f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
