#!/usr/bin/env python3
"""Generate the values table of charts/taskherd/README.md from the `# --` comments in values.yaml.

    gen-readme.py           rewrite the table between the markers in README.md
    gen-readme.py --check   exit 1 if README.md is stale or a value has no `# --` comment

A comment block starting with `# -- ` directly above a key documents that key (continuation lines
are plain `# ` comments). Every leaf value (scalar, list, empty map) must be documented, itself or
through a documented map around it (`resources`, a label selector). Keys inside lists are not walked.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import yaml

CHART = Path(__file__).resolve().parent.parent
START, END = "<!-- values:start -->", "<!-- values:end -->"
KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.-]+):(?:\s|$)")


def documented_keys(text: str) -> dict[str, str]:
    """Dotted key path -> description, for every key with a `# --` comment above it."""
    docs: dict[str, str] = {}
    stack: list[tuple[int, str]] = []  # (indent, key) of the enclosing maps
    comment: list[str] | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("# --"):
            comment = [stripped[4:].strip()]
            continue
        if stripped.startswith("#"):
            if comment is not None:
                comment.append(stripped[1:].strip())
            continue
        if not stripped:
            comment = None
            continue
        if stripped.startswith("-"):  # list items: not walked
            comment = None
            continue
        match = KEY.match(line)
        if not match:
            comment = None
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([k for _, k in stack] + [match["key"]])
        if comment is not None:
            docs[path] = " ".join(comment)
        comment = None
        stack.append((indent, match["key"]))
    return docs


def undocumented(values: dict, docs: dict[str, str], prefix: str = "") -> list[str]:
    """Paths of leaves (scalars, lists, empty maps) with no description on them or a parent:
    a documented map (`resources`, a label selector) documents everything inside it."""
    out: list[str] = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        if path in docs:
            continue
        if isinstance(value, dict) and value:
            out += undocumented(value, docs, path + ".")
        else:
            out.append(path)
    return out


def lookup(values: dict, path: str) -> object:
    node: object = values
    for part in path.split("."):
        node = node[part]  # type: ignore[index]
    return node


def table(text: str) -> tuple[str, list[str]]:
    values = yaml.safe_load(text)
    docs = documented_keys(text)
    missing = undocumented(values, docs)
    rows = ["| Key | Default | Description |", "|---|---|---|"]
    for path, description in docs.items():
        default = json.dumps(lookup(values, path), ensure_ascii=False)
        if len(default) > 60:
            default = default[:57] + "..."
        default = default.replace("|", "\\|")
        description = description.replace("|", "\\|")
        rows.append(f"| `{path}` | `{default}` | {description} |")
    return "\n".join(rows), missing


def render(readme: str, rows: str) -> str:
    before, rest = readme.split(START, 1)
    _, after = rest.split(END, 1)
    return f"{before}{START}\n{rows}\n{END}{after}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if README.md is out of date")
    args = parser.parse_args(argv)
    rows, missing = table((CHART / "values.yaml").read_text())
    readme_path = CHART / "README.md"
    readme = readme_path.read_text()
    wanted = render(readme, rows)
    problems = [f"values.yaml: {p} has no `# --` description" for p in missing]
    if args.check:
        if wanted != readme:
            problems.append("README.md is out of date: run python3 charts/taskherd/hack/gen-readme.py")
    else:
        readme_path.write_text(wanted)
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
