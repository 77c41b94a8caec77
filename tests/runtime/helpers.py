"""Helpers for the runtime tests: the real `taskherd` CLI."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TASKHERD = [sys.executable, "-m", "taskherd.cli"]


def probe(kind: str, directory: Path, *options: str) -> tuple[int, str]:
    """Runs `taskherd probe <kind>` as Kubernetes would: a fresh process reading the heartbeat."""
    done = subprocess.run([*TASKHERD, "probe", kind, "--dir", str(directory), *options],
                          capture_output=True, text=True, timeout=30)
    return done.returncode, (done.stdout + done.stderr).strip()
