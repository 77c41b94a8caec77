"""What people look at: per scenario a summary.json and a timeline.png, per run the matrix — fault x
broker -> verdict, lost, duplicated, recovered, attempts p50/max, recovery seconds — printed and
written to Markdown (and, with --update-docs, into docs/chaos.md). Pure but for writing files."""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from e2e.demo import timeline

from .observe import Sample
from .spec import BROKERS

DOCS = Path(__file__).resolve().parents[2] / "docs" / "chaos.md"
MATRIX_BEGIN = "<!-- chaos matrix: begin (written by `make chaos`) -->"
MATRIX_END = "<!-- chaos matrix: end -->"


@dataclass
class Outcome:
    """One fault on one broker: its verdict and the figures of the matrix."""

    fault: str
    fault_class: str
    broker: str
    status: str  #: "passed", "failed", "excluded" or "not run" (a matrix put together from runs of parts)
    reason: str = ""  #: why excluded, or the first failure
    failures: list[str] = field(default_factory=list)
    lost: int | None = None
    duplicated: int | None = None
    unexpected: int | None = None
    recovered: int | None = None
    sent: int | None = None
    attempts_p50: float | None = None
    attempts_max: int | None = None
    recovery_seconds: float | None = None
    scenario_seconds: float | None = None
    folder: str | None = None

    @property
    def ok(self) -> bool:
        return self.status in ("passed", "excluded")


def _figure(value: Any, fmt: str = "{}") -> str:
    return "–" if value is None else fmt.format(value)


def cell(o: Outcome) -> str:
    if o.status == "excluded":
        return f"excluded: {o.reason}"
    if o.status == "not run":
        return "not run"
    verdict = "**FAIL**" if o.status == "failed" else "pass"
    if o.lost is None:
        return f"{verdict}: {o.reason}"
    attempts = f"{_figure(o.attempts_p50, '{:g}')}/{_figure(o.attempts_max)}"
    return (f"{verdict} · lost {o.lost} · dup {o.duplicated} · rec {o.recovered}/{o.sent} · att {attempts} · "
            f"{_figure(o.recovery_seconds, '{:.0f}')} s")


def matrix_rows(outcomes: Iterable[Outcome]) -> list[tuple[str, str, dict[str, Outcome]]]:
    """(fault, class, broker -> outcome) in the order the faults first ran."""
    rows: dict[str, tuple[str, dict[str, Outcome]]] = {}
    for o in outcomes:
        rows.setdefault(o.fault, (o.fault_class, {}))[1][o.broker] = o
    return [(fault, cls, by_broker) for fault, (cls, by_broker) in rows.items()]


def matrix_markdown(outcomes: Sequence[Outcome], *, title: str) -> str:
    lines = [f"### {title}", "",
             "| fault | class | " + " | ".join(BROKERS) + " |",
             "|---|---|" + "---|" * len(BROKERS)]
    for fault, cls, by_broker in matrix_rows(outcomes):
        cells = [cell(by_broker[b]) if b in by_broker else "not in this file's brokers" for b in BROKERS]
        lines.append(f"| {fault} | {cls} | " + " | ".join(cells) + " |")
    ran = [o for o in outcomes if o.status in ("passed", "failed")]
    failed = [o for o in outcomes if o.status == "failed"]
    lines += ["", f"{len(ran)} scenario(s) ran, {len(failed)} failed, "
                  f"{sum(1 for o in outcomes if o.status == 'excluded')} excluded on this cluster"
                  + (f", {not_run} not run" if (not_run := sum(o.status == 'not run' for o in outcomes)) else "")
                  + ". "
                  "Cells: lost · duplicated · recovered/sent · attempts p50/max · seconds from the fault's end "
                  "to full recovery (queue drained, every worker Ready)."]
    for o in failed:
        lines.append(f"- **{o.fault} on {o.broker}**: " + "; ".join(o.failures or [o.reason]))
    return "\n".join(lines) + "\n"


def outcomes_from_summaries(summaries: Iterable[dict]) -> list[Outcome]:
    """The Outcomes recorded in scenarios' summary.json (as read, in run order): a later summary of
    the same fault on the same broker replaces an earlier one, so runs of parts make one matrix."""
    latest: dict[tuple[str, str], Outcome] = {}
    for summary in summaries:
        outcome = Outcome(**summary["outcome"])
        latest.pop((outcome.fault, outcome.broker), None)
        latest[(outcome.fault, outcome.broker)] = outcome
    return list(latest.values())


def matrix_text(outcomes: Sequence[Outcome]) -> str:
    """The matrix for a terminal: one line per scenario."""
    width = max((len(o.fault) for o in outcomes), default=10)
    return "\n".join(f"  {o.fault:<{width}}  {o.broker:<8}  {cell(o)}" for o in outcomes)


def update_docs(markdown: str, path: Path = DOCS) -> None:
    """Replaces the matrix between the markers of docs/chaos.md."""
    text = path.read_text()
    if MATRIX_BEGIN not in text or MATRIX_END not in text:
        raise ValueError(f"{path} has no matrix markers ({MATRIX_BEGIN} … {MATRIX_END})")
    pattern = re.compile(re.escape(MATRIX_BEGIN) + ".*?" + re.escape(MATRIX_END), re.S)
    path.write_text(pattern.sub(lambda _: f"{MATRIX_BEGIN}\n{markdown}{MATRIX_END}", text))


def write_summary(folder: Path, summary: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "summary.json"
    path.write_text(json.dumps(summary, indent=2, default=_json_default) + "\n")
    return path


def _json_default(value: Any) -> Any:
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, Path):
        return str(value)
    return repr(value)


def draw_timeline(folder: Path, samples: Sequence[Sample], marks: Sequence[timeline.Mark],
                  windows: Sequence[tuple[float, float, str]], *, title: str) -> Path:
    """timeline.png: depth and age; pods, ready, desired and tasks in flight; the DLQ; the fault
    window shaded, the recovery marked."""
    drawn = [timeline.Sample(t=s.t, depth=s.depth, oldest_age_seconds=s.oldest_age_seconds, replicas=s.replicas,
                             ready_replicas=s.ready_replicas, desired_replicas=s.desired_replicas,
                             dlq_depth=s.dlq_depth) for s in samples]
    in_flight = [s.in_flight or 0 for s in samples]
    return timeline.render(drawn, marks, in_flight, folder / "timeline.png", title=title, windows=windows)
