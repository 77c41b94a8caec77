"""The KEY=VALUE files the shell scripts source (e2e/cluster/versions.env, scripts/services.env),
read the same way from Python: one definition of each value for both."""
from __future__ import annotations

from pathlib import Path


def read_env_file(path: Path) -> dict[str, str]:
    """Its KEY=VALUE lines; blank lines and `#` comments skipped."""
    values = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            values[key.strip()] = value.strip()
    return values
