"""Fixtures of tests/worker: they live in worker_support.py, which test modules import by that unique name
(two directories' conftest modules share the name `conftest`, so importing from it is ambiguous)."""
from worker_support import *  # noqa: F401,F403
