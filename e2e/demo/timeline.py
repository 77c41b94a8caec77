"""The run's timeline: what the demo sampled each second, the faults it caused, drawn as one PNG.

Pure apart from writing the file: samples and marks in, picture out, so it is tested with
fabricated samples. Times are seconds since the start of the scenario.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

#: mark kind -> colour of its vertical line
MARK_COLOURS: dict[str, str] = {
    "burst": "tab:blue",
    "kill": "tab:red",
    "oom": "tab:purple",
    "poison": "tab:brown",
    "alert": "tab:orange",
    "scale": "tab:olive",
    "drained": "tab:green",
    "load": "tab:blue",
    "fault": "tab:red",
    "recovered": "tab:green",
}


@dataclass(frozen=True)
class Sample:
    t: float
    depth: int | None  #: ready + reserved/unacknowledged messages in the work queue
    oldest_age_seconds: float | None
    replicas: int  #: pods of the worker Deployment that exist (not terminating)
    ready_replicas: int
    desired_replicas: int | None  #: what the WorkerPool asked for
    dlq_depth: int | None


@dataclass(frozen=True)
class Mark:
    t: float
    kind: str  #: a key of MARK_COLOURS
    label: str


def in_flight_series(intervals: Iterable[tuple[float, float]], times: Sequence[float]) -> list[int]:
    """Number of attempts running at each time, from (start, end) intervals (end exclusive)."""
    starts, ends = [], []
    for start, end in intervals:
        starts.append(start)
        ends.append(end)
    starts.sort()
    ends.sort()
    return [bisect.bisect_right(starts, t) - bisect.bisect_right(ends, t) for t in times]


def render(samples: Sequence[Sample], marks: Sequence[Mark], in_flight: Sequence[int], path: Path,
           *, title: str = "taskherd demo", windows: Sequence[tuple[float, float, str]] = ()) -> Path:
    """Draws depth and age, replicas and in-flight tasks, and the DLQ, with the faults as lines and
    `windows` (start, end, label) — a fault held for a while — shaded."""
    if len(in_flight) != len(samples):
        raise ValueError(f"in_flight has {len(in_flight)} values for {len(samples)} samples: one per sample")
    import matplotlib

    matplotlib.use("Agg")  # no display: the picture goes to a file
    import matplotlib.pyplot as plt

    t = [s.t for s in samples]
    fig, (ax_queue, ax_pool, ax_dlq) = plt.subplots(3, 1, sharex=True, figsize=(11, 8),
                                                     gridspec_kw={"height_ratios": [3, 3, 1.4]})
    fig.suptitle(title)

    ax_queue.plot(t, _series(samples, "depth"), color="tab:blue", label="queue depth (ready + unacked)")
    ax_queue.set_ylabel("messages")
    ax_age = ax_queue.twinx()
    ax_age.plot(t, _series(samples, "oldest_age_seconds"), color="tab:gray", linestyle="--",
                label="oldest message age")
    ax_age.set_ylabel("seconds")
    _legend(ax_queue, ax_age)

    ax_pool.step(t, [s.replicas for s in samples], where="post", color="tab:green", label="worker pods")
    ax_pool.step(t, [s.ready_replicas for s in samples], where="post", color="tab:olive", linestyle=":",
                 label="ready pods")
    ax_pool.step(t, _series(samples, "desired_replicas"), where="post", color="black", linestyle="--",
                 linewidth=0.8, label="desired (WorkerPool)")
    ax_pool.plot(t, list(in_flight), color="tab:cyan", label="tasks in flight")
    ax_pool.set_ylabel("count")
    ax_pool.legend(loc="upper right", fontsize="small")

    ax_dlq.step(t, _series(samples, "dlq_depth"), where="post", color="tab:red", label="dead-letter queue")
    ax_dlq.set_ylabel("DLQ")
    ax_dlq.set_xlabel("seconds since the first task was sent")
    ax_dlq.legend(loc="upper left", fontsize="small")

    for start, end, label in windows:
        for ax in (ax_queue, ax_pool, ax_dlq):
            ax.axvspan(start, end, color="tab:red", alpha=0.12, linewidth=0)
        ax_queue.annotate(label, xy=(start, 0.02), xycoords=("data", "axes fraction"), fontsize="x-small",
                          color="tab:red")
    for i, mark in enumerate(group_marks(marks)):
        colour = MARK_COLOURS.get(mark.kind, "black")
        for ax in (ax_queue, ax_pool, ax_dlq):
            ax.axvline(mark.t, color=colour, alpha=0.6, linewidth=1)
        # labels alternate between the top and the middle of the panel so neighbours do not overlap
        ax_queue.annotate(mark.label, xy=(mark.t, 0.98 if i % 2 == 0 else 0.55), xycoords=("data", "axes fraction"),
                          rotation=90, va="top", ha="right", fontsize="x-small", color=colour)
    for ax in (ax_queue, ax_pool, ax_dlq):
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    ax_age.set_ylim(bottom=0)

    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def group_marks(marks: Sequence[Mark], *, within: float = 3.0) -> list[Mark]:
    """Marks of one kind closer than `within` seconds become one, labelled with the first and a count."""
    grouped: list[list[Mark]] = []
    for mark in sorted(marks, key=lambda m: m.t):
        same = next((g for g in grouped if g[0].kind == mark.kind and mark.t - g[-1].t <= within), None)
        if same is None:
            grouped.append([mark])
        else:
            same.append(mark)
    return [Mark(g[0].t, g[0].kind, g[0].label + (f" (+{len(g) - 1})" if len(g) > 1 else "")) for g in grouped]


def _series(samples: Sequence[Sample], name: str) -> list[float]:
    """One attribute per sample; an unknown value (None) becomes a gap in the line."""
    return [float("nan") if getattr(s, name) is None else getattr(s, name) for s in samples]


def _legend(*axes) -> None:
    handles, labels = [], []
    for ax in axes:
        h, lab = ax.get_legend_handles_labels()
        handles += h
        labels += lab
    axes[0].legend(handles, labels, loc="center right", fontsize="small")
