"""The pytest plugin of the cluster tests (registered in pyproject.toml: ``-p e2e.lib.pytest_plugin``).

It owns, once for the whole suite:

- ``cluster``: the session's cluster (e2e/lib/cluster.py picks it: an explicit kubeconfig, else
  kind, else the local cluster of ``make cluster``), waited for until its API server is ready and a
  node is Ready. An unreachable cluster FAILS the tests that need it with the exact error; nothing
  is skipped. A test that uses it is marked ``cluster``.
- ``namespace``: a fresh namespace per test, labelled ``taskherd.io/test`` and annotated with the
  process that owns it, deleted after the test (``--keep-namespaces`` keeps them to look at).
  Namespaces whose owner process is gone (a killed run) are removed when a session starts;
  those of runs still going, from this machine or another, are left alone.
- the trail of a failing test: the pods, events and container logs of every test namespace alive
  when it failed, and whatever a fixture registered with :func:`add_failure_report` (an
  operator's log, say), attached to the report as sections, the way kubernetes-sigs/e2e-framework
  and KEDA's e2e helpers dump a failed test's namespace.
"""
from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from . import cluster as clusterlib

TEST_LABEL = "taskherd.io/test"
OWNER_ANNOTATION = "taskherd.io/test-owner"
#: A namespace from another machine (or with no owner) is a leftover only after this long: no
#: session on a shared cluster runs that long, and its owner cannot be asked.
STALE_AFTER = timedelta(hours=6)
REPORT_CHARS = 30_000

_live_namespaces = pytest.StashKey[dict[str, clusterlib.Cluster]]()
_failure_reports = pytest.StashKey[list[tuple[str, Callable[[], str]]]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--keep-namespaces", action="store_true",
                     help="keep each cluster test's namespace after it ends (the next session removes it)")
    parser.addini("still_running_after", "seconds a test may run without a line before one names it",
                  default="25")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cluster: needs a Kubernetes cluster (`make cluster`); every test that "
                                       "uses the `cluster` fixture has it")
    # Progress of the bounded waits and of cluster selection: shown with a failing test's
    # captured log, and live with --log-cli-level=INFO.
    logging.getLogger("taskherd.e2e").setLevel(logging.INFO)
    config.stash[_live_namespaces] = {}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cluster)


# --- who owns a test namespace -------------------------------------------------------------------

def process_identity(pid: int) -> str | None:
    """`<pid>.<start time>` of a live process (the start time tells a reused PID apart), else None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return f"{pid}.{stat.rsplit(')', 1)[1].split()[19]}"


def this_owner() -> str:
    return f"{socket.gethostname()}/{process_identity(os.getpid())}"


def _still_running(process: str) -> bool:
    pid = process.partition(".")[0]
    return pid.isdigit() and process_identity(int(pid)) == process


def is_leftover(namespace: dict, *, host: str, alive: Callable[[str], bool], now: datetime) -> bool:
    """Whether a test namespace is a dead run's: its owner on this host is gone, or it is older than
    STALE_AFTER and its owner cannot be asked (another host, or no owner recorded)."""
    meta = namespace["metadata"]
    if meta.get("deletionTimestamp"):
        return False
    owner_host, _, process = (meta.get("annotations") or {}).get(OWNER_ANNOTATION, "").partition("/")
    if owner_host == host and process:
        return not alive(process)
    created = datetime.fromisoformat(meta["creationTimestamp"].replace("Z", "+00:00"))
    return now - created > STALE_AFTER


def remove_leftovers(cluster: clusterlib.Cluster) -> list[str]:
    namespaces = cluster.kubectl_json("get", "namespaces", "-l", TEST_LABEL)["items"]
    host, now = socket.gethostname(), datetime.now(timezone.utc)
    leftovers = [ns["metadata"]["name"] for ns in namespaces
                 if is_leftover(ns, host=host, alive=_still_running, now=now)]
    for name in leftovers:
        cluster.delete_namespace(name)
    if leftovers:
        logging.getLogger("taskherd.e2e").info("removed namespaces of runs that are gone: %s", leftovers)
    return leftovers


# --- fixtures ------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def cluster() -> clusterlib.Cluster:
    c = clusterlib.resolve()
    try:
        c.check_reachable(timeout=60)
        unavailable = None
    except clusterlib.ClusterUnavailable as e:
        unavailable = str(e)
    if unavailable:  # outside the except: the report shows the reason once, without a traceback
        pytest.fail(unavailable, pytrace=False)
    remove_leftovers(c)
    return c


@pytest.fixture(scope="session")
def test_image(cluster) -> tuple[str, str]:
    """(image, imagePullPolicy) for test pods: a Debian image with a shell and python3."""
    return cluster.test_image()


@pytest.fixture
def namespace(cluster, request) -> str:
    """A fresh namespace for this test alone."""
    return create_test_namespace(cluster, request)


def create_test_namespace(cluster: clusterlib.Cluster, request: pytest.FixtureRequest, *,
                          labels: dict[str, str] | None = None) -> str:
    """A namespace named after the requesting test (or module), labelled for cleanup, deleted when
    the fixture's scope ends; while it exists, a failing test's report carries its trail."""
    node = request.node
    suite = _dns_label(node.path.parent.name, 15)
    name = f"{suite}-{_dns_label(node.name, 30)}-{uuid.uuid4().hex[:6]}"
    live = request.config.stash[_live_namespaces]
    live[name] = cluster

    def remove() -> None:
        live.pop(name, None)
        if not request.config.getoption("--keep-namespaces"):
            cluster.delete_namespace(name)

    request.addfinalizer(remove)
    return cluster.create_namespace(name, {TEST_LABEL: f"{suite}-test", **(labels or {})},
                                    {OWNER_ANNOTATION: this_owner()})


def _dns_label(text: str, length: int) -> str:
    """`text` as a piece of a namespace name (lowercase letters, digits and dashes)."""
    return "".join(ch if ch.isascii() and ch.isalnum() else "-" for ch in text.lower())[:length].strip("-")


# --- the trail of a failing test -----------------------------------------------------------------

def add_failure_report(item: pytest.Item, title: str, produce: Callable[[], str]) -> None:
    """`produce()` is called only if `item` fails, and its text attached to the report as `title`."""
    item.stash.setdefault(_failure_reports, []).append((title, produce))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if report.failed and report.when in ("setup", "call"):
        live = item.config.stash[_live_namespaces]
        sections = [(f"namespace {name}: pods, events, logs", lambda c=c, name=name: c.describe_namespace(name))
                    for name, c in live.items()]
        for title, produce in sections + item.stash.get(_failure_reports, []):
            try:
                text = produce()
            except Exception as e:  # noqa: BLE001 - the report says what could not be collected
                text = f"(could not be collected: {e!r})"
            report.sections.append((title, text[-REPORT_CHARS:]))
    return report


# --- a line while a long test runs ----------------------------------------------------------------
# `-q` prints one character per test; a cluster test (a demo, a chaos scenario) can take minutes, and
# a newcomer cannot tell that from a hang. While one test (with its fixtures) runs longer than the
# ini option `still_running_after` (seconds) without a line, a line says which and for how long.

_running = pytest.StashKey[dict]()
_stop_reporting = pytest.StashKey[threading.Event]()


def still_running_line(nodeid: str, started: float, now: float) -> str:
    elapsed = int(now - started)
    return f"… still running {nodeid} ({elapsed // 60}m{elapsed % 60:02d}s)"


def _report_long_tests(config: pytest.Config, stop: threading.Event) -> None:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    quiet_limit = float(config.getini("still_running_after"))
    state = config.stash[_running]
    while not stop.wait(min(5.0, quiet_limit / 4)):
        nodeid, started, last_line = state.get("nodeid"), state.get("started"), state.get("last_line")
        now = time.monotonic()
        if reporter is None or nodeid is None or now - last_line < quiet_limit:
            continue
        # Output capture would swallow the line into the test's own report: step past it, as
        # pytest's live logging does.
        capture = config.pluginmanager.get_plugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            if reporter._tw.width_of_current_line:  # after a run of dots: a line of its own
                reporter.write("\n")
            reporter.write_line(still_running_line(nodeid, started, now))
            reporter.flush()  # output piped to a file or `tee` is block-buffered
        state["last_line"] = now


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_running] = {}
    stop = threading.Event()
    session.config.stash[_stop_reporting] = stop
    threading.Thread(target=_report_long_tests, args=(session.config, stop), name="taskherd-still-running",
                     daemon=True).start()


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _stop_reporting in session.config.stash:
        session.config.stash[_stop_reporting].set()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):  # noqa: ARG001 - pytest's hook signature
    now = time.monotonic()
    item.config.stash[_running].update(nodeid=item.nodeid, started=now, last_line=now)
