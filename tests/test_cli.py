"""`taskherd`: one command listing every subcommand; each answers --help with its usage and exit 0."""
import subprocess
import sys

import pytest

from taskherd import cli

TASKHERD = [sys.executable, "-m", "taskherd.cli"]
SUBCOMMANDS = [["probe"], ["probe", "liveness"], ["probe", "readiness"], ["probe", "startup"], ["drain"],
               ["dlq"], ["dlq", "list"], ["dlq", "show"], ["dlq", "redrive"], ["dlq", "purge"],
               ["outbox"], ["outbox", "relay"], ["outbox", "migrate"], ["outbox", "status"],
               ["exporter"], ["recover"]]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*TASKHERD, *args], capture_output=True, text=True, timeout=60)


def test_help_lists_every_command_and_version_prints_the_package_version():
    result = run("--help")
    assert result.returncode == 0
    for name in cli.COMMANDS:
        assert f"  {name} " in result.stdout
    version = run("--version")
    assert version.returncode == 0 and version.stdout.startswith("taskherd 0.")


@pytest.mark.parametrize("command", SUBCOMMANDS, ids=" ".join)
def test_every_command_answers_help_with_its_usage(command):
    result = run(*command, "--help")
    assert result.returncode == 0, result.stderr
    assert "usage: taskherd " + command[0] in result.stdout


def test_an_unknown_command_is_a_usage_error_listing_the_commands():
    result = run("drian")
    assert result.returncode == 2 and "unknown command 'drian'" in result.stderr and "drain" in result.stderr


@pytest.mark.parametrize("command,flag", [(["dlq", "list"], "-b"), (["exporter"], "-b"), (["outbox", "relay"], "-b"),
                                          (["recover"], "-b"), (["dlq", "list"], "-Q"), (["exporter"], "-Q"),
                                          (["outbox", "relay"], "-A"), (["dlq", "list"], "--global-keyprefix"),
                                          (["exporter"], "--global-keyprefix"), (["recover"], "--global-keyprefix"),
                                          (["exporter"], "--dead-letter-queues"), (["dlq", "list"], "--dead-letter-queues")])
def test_options_are_spelled_as_celery_spells_them_everywhere(command, flag):
    assert flag in run(*command, "--help").stdout
