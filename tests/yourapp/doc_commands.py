"""The commands of a Markdown guide, as a reader pastes them (pure).

Every fenced block whose info string is `sh` is a step, run in order in one shell session. A block
directly preceded by `<!-- not run by tests/yourapp: WHY -->` is an alternative the test cannot take
(another cluster, a registry) and is left out; a block preceded by `<!-- cleanup -->` is run at the
end, also when a step failed. Blocks of any other language (`text`, `yaml`, `python`) are shown
output or file contents, never run.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_FENCE = re.compile(r"^```(?P<info>[^\n`]*)\n(?P<body>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_MARK = re.compile(r"<!--\s*(?P<mark>not run by tests/yourapp|cleanup)\b[^>]*-->\s*$")


@dataclass(frozen=True)
class Block:
    #: 1-based line of the opening fence, for messages
    line: int
    body: str
    #: "step", "cleanup" or "skipped"
    role: str
    #: the nearest heading above the block
    section: str


def blocks(markdown: str) -> list[Block]:
    """Every `sh` block of the guide, in order, with its role."""
    found = []
    for match in _FENCE.finditer(markdown):
        if match.group("info").strip() != "sh":
            continue
        before = markdown[:match.start()].rstrip().splitlines()
        mark = _MARK.search(before[-1]) if before else None
        role = "step" if mark is None else "skipped" if mark.group("mark").startswith("not run") else "cleanup"
        prose = _FENCE.sub("", markdown[:match.start()]).splitlines()  # a `# comment` in a block is no heading
        headings = [line.lstrip("#").strip() for line in prose if line.startswith("#")]
        found.append(Block(line=markdown.count("\n", 0, match.start()) + 1, body=match.group("body"),
                           role=role, section=headings[-1] if headings else ""))
    return found


def script(steps: list[Block], *, stop_at_first_failure: bool = True) -> str:
    """One bash script running `steps` in order; each says where it comes from before it runs.
    A cleanup script goes on past a failing command (it removes whatever the steps got to create)."""
    parts = ["set -euo pipefail" if stop_at_first_failure else "set -uo pipefail"]
    for block in steps:
        parts.append(f"echo '=== docs/your-app.md line {block.line}: {block.section.replace(chr(39), '')}' >&2")
        parts.append(block.body.rstrip())
    return "\n".join(parts) + "\n"
