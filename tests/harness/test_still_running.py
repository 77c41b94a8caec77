"""A test that runs long without a line gets one naming it (e2e/lib/pytest_plugin.py), so a quiet
`make test` is never mistaken for a hang; a short one adds nothing. Run as a user runs pytest."""


def test_a_long_quiet_test_is_named_while_it_runs_and_a_short_one_is_not(pytester):
    pytester.makeini("[pytest]\nstill_running_after = 1\n")
    pytester.makepyfile("""
        import time

        def test_short():
            pass

        def test_long_and_quiet():
            print("the test's own output")
            time.sleep(2.6)
    """)
    result = pytester.runpytest("-q", "-p", "e2e.lib.pytest_plugin")
    result.assert_outcomes(passed=2)
    assert "the test's own output" not in result.stdout.str()  # still captured: only the line gets through
    lines = [line for line in result.stdout.lines if "still running" in line]
    assert lines and all(line.startswith("… still running") and "test_long_and_quiet" in line
                         for line in lines), result.stdout.str()
    assert lines[0].endswith("(0m01s)") or lines[0].endswith("(0m02s)")
