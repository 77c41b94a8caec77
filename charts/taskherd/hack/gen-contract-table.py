#!/usr/bin/env python3
"""Regenerates the contract table of docs/chart.md from taskherd.contract.VARIABLES (run it with the
project's .venv, where taskherd is installed).

    python charts/taskherd/hack/gen-contract-table.py          # rewrite docs/chart.md
    python charts/taskherd/hack/gen-contract-table.py --check  # exit 1 if it is out of date
"""
from __future__ import annotations

import sys
from pathlib import Path

from taskherd import contract

REPO = Path(__file__).resolve().parents[3]

DOC = REPO / "docs" / "chart.md"
START, END = "<!-- contract-table:start -->", "<!-- contract-table:end -->"


def table() -> str:
    rows = ["| variable | set by the chart on | valid | default | read by | meaning |",
            "|---|---|---|---|---|---|"]
    for v in contract.VARIABLES:
        default = "" if v.default in (None, "") else f"`{v.default}`"
        rows.append(f"| `{v.name}` | {', '.join(v.chart) or '(you may set it)'} | {v.valid} | {default} | "
                    f"{', '.join(v.readers)} | {v.doc} |")
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    text = DOC.read_text()
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    if not rest:
        print(f"{DOC}: markers {START} … {END} not found", file=sys.stderr)
        return 2
    new = f"{head}{START}\n{table()}\n{END}{tail}"
    if "--check" in argv:
        if new != text:
            print(f"{DOC}: the contract table is out of date: run {Path(__file__).relative_to(REPO)}",
                  file=sys.stderr)
            return 1
        return 0
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
