"""Puts the directories of pyproject.toml's pytest `pythonpath` on sys.path, so that a benchmark run
as a script (`python bench/x.py`, as mk/bench.mk does) imports the same shared helpers as the tests
(e2e.lib, support, apps). Import it first: `import repo_paths  # noqa: F401`."""
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

with open(ROOT / "pyproject.toml", "rb") as pyproject:
    _paths = tomllib.load(pyproject)["tool"]["pytest"]["ini_options"]["pythonpath"]
sys.path[:0] = [str(ROOT / path) for path in _paths if str(ROOT / path) not in sys.path]
