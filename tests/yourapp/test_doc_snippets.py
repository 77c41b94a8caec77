"""The Python a reader pastes from the guides to set up an app: every ```python block of README.md
and docs/{your-app,reliability,runtime,effects}.md that calls configure(), run as it is.

Found by a newcomer's app: runtime.md's way to replace the heartbeat appended the new Heartbeat after
Drain, and configure() refused that list ("Drain needs Heartbeat before it in the list"). The sh
blocks of your-app.md have their own test (test_your_app_doc.py); these blocks ran nowhere.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GUIDES = ("README.md", "docs/your-app.md", "docs/reliability.md", "docs/runtime.md", "docs/effects.md")
_PYTHON = re.compile(r"^```python\n(?P<body>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
#: what the snippets take for granted: an app (runtime.md's block configures "your app")
PRELUDE = 'from celery import Celery\napp = Celery("snippet", broker="redis://127.0.0.1:1/0")\n'


def configure_snippets() -> list[tuple[str, str]]:
    found = []
    for guide in GUIDES:
        text = (REPO / guide).read_text()
        for match in _PYTHON.finditer(text):
            if "configure(" in match.group("body"):
                line = text.count("\n", 0, match.start()) + 1
                found.append((f"{guide}:{line}", match.group("body")))
    return found


def test_the_guides_show_configure_snippets():
    where = [place.split(":")[0] for place, _ in configure_snippets()]
    assert {"README.md", "docs/your-app.md", "docs/reliability.md", "docs/runtime.md"} <= set(where)


@pytest.mark.parametrize("place,body", configure_snippets(), ids=[p for p, _ in configure_snippets()])
def test_a_configure_snippet_runs_as_pasted(place, body):
    # A fresh interpreter per snippet, without the TASKHERD_* variables of whoever runs the tests
    # (a pod's environment overrides what the code says).
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKHERD_")}
    done = subprocess.run([sys.executable, "-c", PRELUDE + body], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=60)
    assert done.returncode == 0, f"{place}: the snippet fails as pasted:\n{done.stderr[-2000:]}"


def test_the_postgres_decorator_snippet_commits_the_key_with_the_effect(pg_dsn):
    """effects.md's `@idempotent(PostgresStore(), connection=...)` example: the effect runs once per
    key, and a body that fails after its effect leaves neither the key nor the effect."""
    import psycopg

    text = (REPO / "docs/effects.md").read_text()
    (body,) = [m.group("body") for m in _PYTHON.finditer(text) if "connection=lambda" in m.group("body")]
    namespace = {"DSN": pg_dsn}
    exec(PRELUDE + "import psycopg\nfrom taskherd.worker import configure\nfrom taskherd.worker.idempotency "
         "import PostgresStore, idempotent\nconfigure(app)\npg = PostgresStore()\n" + body, namespace)
    with psycopg.connect(pg_dsn) as conn:
        namespace["pg"].create_table(conn)
        conn.execute("create table shipments (order_id text)")
    ship_once = namespace["ship_once"]
    assert ship_once.apply(args=("o1",)).get() == {"shipped": "o1"}
    assert ship_once.apply(args=("o1",)).get() == {"shipped": "o1"}, "the duplicate gets the stored result"

    def fails_after_the_effect(task, order_id, conn):
        conn.execute("insert into shipments (order_id) values (%s)", (order_id,))
        raise ConnectionResetError("the worker lost its database after the insert")

    namespace["_ship"] = namespace["idempotent"](
        namespace["pg"], key=lambda task, order_id, conn: f"ship:{order_id}",
        connection=lambda task, order_id, conn: conn)(fails_after_the_effect)
    with pytest.raises(ConnectionResetError):
        ship_once.apply(args=("o2",), throw=True).get()
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("select order_id from shipments order by 1").fetchall() == [("o1",)]
        assert conn.execute("select key from taskherd_idempotency").fetchall() == [("ship:o1",)]
