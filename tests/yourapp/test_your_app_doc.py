"""docs/your-app.md, followed literally on the local cluster with the mailer (tests/yourapp/app).

The guide's `sh` blocks are the test's commands (doc_commands.py): run in order in one bash session
from the repository root, with the guide's variables set to a copy of the mailer (`APP_DIR`), the
test's own namespace (`NS`) and the mailer's image (`IMAGE`); the cleanup block runs afterwards
whatever happened. The guide's own checks decide: `python3 -m mailer.check` exits 1 on a lost or
duplicated mail, `kubectl wait` on a page that never fires. The files the guide shows (Dockerfile,
values, requirements) must be the mailer's, so that what a reader copies is what was tested.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from doc_commands import blocks, script

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "your-app.md"
APP = Path(__file__).resolve().parent / "app"
#: the image the mailer's values.yaml names (registry taskherd.local, repository mailer, tag 1)
IMAGE = "taskherd.local/mailer:1"
_SHOWN = re.compile(r"^```(?P<info>[^\n`]*)\n(?P<body>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def shown_files(markdown: str) -> dict[str, str]:
    """The file contents the guide shows, by the info string of their block."""
    return {m.group("info").strip(): m.group("body") for m in _SHOWN.finditer(markdown)
            if m.group("info").strip() in ("Dockerfile", "yaml")}


def test_the_guide_shows_the_mailers_own_files():
    guide = GUIDE.read_text()
    shown = shown_files(guide)
    assert shown["Dockerfile"] == (APP / "Dockerfile").read_text()
    assert shown["yaml"] == (APP / "values.yaml").read_text()
    assert "# requirements.txt\n" + (APP / "requirements.txt").read_text() in guide


def test_the_python_the_guide_shows_is_the_mailers_own_code():
    """Each ```python block headed `# mailer/<file>.py` is an excerpt of that file: its lines, in order,
    with `...` for what it leaves out. (The tasks block once used `store.keys` and `store.connect()`
    without showing the store: a newcomer pasting it had neither.)"""
    guide = GUIDE.read_text()
    excerpts = [m.group("body") for m in _SHOWN.finditer(guide) if m.group("info").strip() == "python"
                and re.match(r"# mailer/\w+\.py", m.group("body"))]
    assert len(excerpts) >= 3, "app.py, store.py and tasks.py are shown"
    for excerpt in excerpts:
        name = re.match(r"# (mailer/\w+\.py)", excerpt).group(1)
        source = [line.strip() for line in (APP / name).read_text().splitlines()]
        shown = [line.strip() for line in excerpt.splitlines()[1:]
                 if line.strip() and not line.strip().startswith("#") and line.strip() != "..."]
        at = 0
        for line in shown:
            assert line in source[at:], f"docs/your-app.md shows {name} with a line it does not have (in " \
                                        f"this order): {line!r}"
            at = source.index(line, at) + 1
        for imported in re.findall(r"^(?:from \S+ )?import (\w+)", (APP / name).read_text(), re.MULTILINE):
            if re.search(rf"\b{imported}\.", excerpt) or re.search(rf"\b{imported}\b\(", excerpt):
                assert re.search(rf"^(from \S+ )?import {imported}\b", excerpt, re.MULTILINE), \
                    f"docs/your-app.md: the {name} excerpt uses {imported} without showing its import"


def test_the_guide_has_steps_and_a_cleanup():
    found = blocks(GUIDE.read_text())
    assert [b.role for b in found].count("cleanup") == 1 and found[-1].role == "cleanup"
    assert any("make app-image" in b.body for b in found if b.role == "step")
    assert any("helm install" in b.body for b in found if b.role == "step")


def _run(code: str, env: dict[str, str], log: Path, timeout: float) -> subprocess.CompletedProcess:
    with log.open("w") as out:
        done = subprocess.run(["bash", "-c", code], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout)
    done.stdout = log.read_text()
    return done


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_following_the_guide_runs_the_mailer_under_taskherd(cluster, namespace, tmp_path):
    if not cluster.is_local:
        pytest.fail(f"the guide's commands take the local cluster's path (`make cluster-env`); this session "
                    f"resolved the {cluster.source} cluster", pytrace=False)
    app_dir = tmp_path / "mailer"
    shutil.copytree(APP, app_dir, ignore=shutil.ignore_patterns("wheels", "__pycache__"))
    env = {**os.environ, "APP_DIR": str(app_dir), "NS": namespace, "IMAGE": IMAGE}
    found = blocks(GUIDE.read_text())
    steps = [b for b in found if b.role == "step"]
    cleanup = [b for b in found if b.role == "cleanup"]

    # A reader runs the cleanup in the shell of the steps (KUBECONFIG and PATH from `make cluster-env`):
    # the steps' exported variables are handed to the cleanup's shell, however the steps ended.
    exported = tmp_path / "exported.sh"
    started = time.monotonic()
    try:
        run = _run(f"trap 'export -p > {exported}' EXIT\n" + script(steps), env, tmp_path / "steps.log",
                   timeout=1200)
    finally:
        removed = _run(f"[ -f {exported} ] && source {exported}\n" + script(cleanup, stop_at_first_failure=False),
                       env, tmp_path / "cleanup.log", timeout=300)
    minutes = (time.monotonic() - started) / 60
    print(f"docs/your-app.md followed in {minutes:.1f} min (steps and cleanup)")
    output = run.stdout
    assert run.returncode == 0, f"a step of docs/your-app.md failed (exit {run.returncode}):\n{output[-8000:]}"

    # The effects, as the guide's check printed them.
    assert "sent once 20/20, lost 0, duplicated 0" in output
    assert "sent once 60/60, lost 0, duplicated 0" in output
    # The dead letter, as `taskherd dlq list --json` printed it: one JSON object per line.
    letters = [json.loads(line) for line in output.splitlines() if line.startswith('{"ref"')]
    assert letters and all(letter["task"] == "mailer.send_welcome" and letter["args"] == ["nobody-0000"]
                           and letter["reason"] == "permanent-error" and letter["attempts"] == 1
                           for letter in letters), letters
    # The pool processes SIGKILLed mid-mail, named by the WorkerPool.
    printed = [line for line in output.splitlines() if line.startswith("[{")]
    assert printed, "the WorkerPool's status.recentTerminations was empty after the pool processes were killed"
    terminations = json.loads(printed[-1])
    assert any(t.get("process") == "pool-child" and t.get("reason") == "SIGKILL" for t in terminations), terminations

    assert removed.returncode == 0, f"the guide's cleanup failed:\n{removed.stdout[-4000:]}"
    assert cluster.kubectl("-n", namespace, "get", "deployments", "-o", "name").stdout == ""
