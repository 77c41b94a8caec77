"""A failing test's report carries what its fixtures registered (e2e/lib/pytest_plugin.py), run as
a user runs pytest: an inner session through pytester."""


def test_a_failing_test_carries_what_its_fixtures_registered_and_a_passing_one_costs_nothing(pytester, tmp_path):
    asked = tmp_path / "asked"
    pytester.makepyfile(f"""
        import pytest
        from e2e.lib.pytest_plugin import add_failure_report

        @pytest.fixture
        def operator_log(request):
            def produce():
                with open({str(asked)!r}, "a") as f:
                    f.write(request.node.name + "\\n")
                return "operator: poll completed\\noperator: scaled 1 -> 4"
            add_failure_report(request.node, "operator log (last lines)", produce)

        def test_fails(operator_log):
            assert 1 == 2

        def test_passes(operator_log):
            pass
    """)
    result = pytester.runpytest("-p", "e2e.lib.pytest_plugin")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(["*- operator log (last lines) -*", "operator: poll completed", "operator: scaled 1 -> 4"])
    assert asked.read_text() == "test_fails\n"
