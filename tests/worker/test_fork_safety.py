"""A pool child must not inherit an import lock held by one of the parent's threads.

CPython keeps per-module import locks across fork: a child forked while another thread of the
parent was importing a module deadlocks on its own first import of that module. getaddrinfo()
imports the IDNA codec on its first use with a host name, so taskherd.worker imports it before any
thread starts (the chaos suite found a new worker's first task stuck resolving its database's name
until its hard time limit)."""
from __future__ import annotations

import subprocess
import sys
import textwrap


def test_importing_taskherd_worker_imports_the_idna_codec_first():
    out = subprocess.run([sys.executable, "-c", "import sys, taskherd.worker; print('encodings.idna' in sys.modules)"],
                         capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "True"


def test_a_child_forked_during_an_import_deadlocks_on_that_module(tmp_path):
    """Why the import above matters: the mechanism, with a module that takes a second to import."""
    (tmp_path / "slow_module.py").write_text("import time\ntime.sleep(1.0)\n")
    script = textwrap.dedent("""
        import os, sys, threading, time
        sys.path.insert(0, sys.argv[1])
        threading.Thread(target=lambda: __import__("slow_module"), daemon=True).start()
        time.sleep(0.3)  # the thread is inside the import, holding its module lock
        pid = os.fork()
        if pid == 0:
            import slow_module  # never returns: the lock's holder does not exist in the child
            os._exit(0)
        deadline = time.time() + 5
        while time.time() < deadline:
            if os.waitpid(pid, os.WNOHANG)[0]:
                print("child finished")
                break
            time.sleep(0.1)
        else:
            os.kill(pid, 9)
            print("child stuck")
    """)
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "child stuck", out.stdout + out.stderr
