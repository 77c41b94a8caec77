"""Which blocks of a guide the doc test runs: `sh` steps in order, marked alternatives left out,
the cleanup kept for the end."""
import subprocess

from doc_commands import blocks, script

GUIDE = """# Guide

## Build

```sh
echo one
echo two
```

```text
# not a heading
$ not a command
```

<!-- not run by tests/yourapp: needs a registry -->
```sh
exit 1
```

## Watch

```sh
echo "it's three"
```

<!-- cleanup -->
```sh
echo done
```
"""


def test_steps_alternatives_and_cleanup_are_told_apart():
    found = blocks(GUIDE)
    assert [(b.role, b.section, b.body) for b in found] == [
        ("step", "Build", "echo one\necho two\n"), ("skipped", "Build", "exit 1\n"),
        ("step", "Watch", "echo \"it's three\"\n"), ("cleanup", "Watch", "echo done\n")]
    assert found[0].line == 5
    assert found[1].section == "Build", "a comment in a code block is no heading"


def test_the_script_runs_the_steps_in_order_and_stops_at_the_first_failure():
    steps = [b for b in blocks(GUIDE) if b.role == "step"]
    done = subprocess.run(["bash", "-c", script(steps)], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == "one\ntwo\nit's three\n"
    assert "=== docs/your-app.md line 5: Build" in done.stderr
    failing = blocks(GUIDE.replace("echo two", "false"))
    done = subprocess.run(["bash", "-c", script([b for b in failing if b.role == "step"])],
                          capture_output=True, text=True)
    assert done.returncode == 1 and done.stdout == "one\n"


def test_a_cleanup_script_goes_on_past_a_failure():
    cleanup = blocks(GUIDE.replace("echo done", "false\necho done"))[-1]
    done = subprocess.run(["bash", "-c", script([cleanup], stop_at_first_failure=False)],
                          capture_output=True, text=True)
    assert done.stdout == "done\n"
