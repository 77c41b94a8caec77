"""Terminal narration: phase headings, timestamped lines, one status line per tick."""
from __future__ import annotations

import sys
import time

from .timeline import Sample

_BOLD = "\033[1m" if sys.stdout.isatty() else ""
_RESET = "\033[0m" if sys.stdout.isatty() else ""


class Narrator:
    def __init__(self, *, t0: float | None = None):
        self.t0 = t0 or time.time()
        self.started = time.time()

    def _clock(self) -> str:
        return f"{time.time() - self.t0:6.0f}s"

    def phase(self, title: str) -> None:
        print(f"\n{_BOLD}━━ {title} {'━' * max(3, 72 - len(title))}{_RESET}", flush=True)

    def say(self, text: str) -> None:
        print(f"[{self._clock()}] {text}", flush=True)

    def status(self, sample: Sample, *, in_flight: int, effects: int, expected: int, reason: str | None) -> None:
        depth = "?" if sample.depth is None else sample.depth
        age = "?" if sample.oldest_age_seconds is None else f"{sample.oldest_age_seconds:.0f}s"
        desired = "?" if sample.desired_replicas is None else sample.desired_replicas
        dlq = "?" if sample.dlq_depth is None else sample.dlq_depth
        line = (f"depth {depth:>4}  oldest {age:>4}  pods {sample.ready_replicas}/{sample.replicas} ready"
                f" (desired {desired})  in flight {in_flight:>2}  charged {effects}/{expected}  DLQ {dlq}")
        self.say(line + (f"  — {reason}" if reason else ""))
