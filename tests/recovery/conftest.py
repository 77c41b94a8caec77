"""The crash-point matrix is printed at the end of the run (tests/recovery/test_crash_matrix.py)."""
import pytest

#: Lines of the crash-point matrix, added by the test that runs it.
MATRIX_KEY = pytest.StashKey[list]()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    lines = config.stash.get(MATRIX_KEY, None)
    if lines:
        terminalreporter.section("crash-point matrix: step x broker x store -> outcome")
        for line in lines:
            terminalreporter.write_line(line)
