"""Fixtures of tests/chart: they live in chart_support.py, which test modules import by that unique name
(two directories' conftest modules share the name `conftest`, so importing from it is ambiguous)."""
from chart_support import *  # noqa: F401,F403
