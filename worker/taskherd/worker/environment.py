"""The chart <-> worker contract: settings a pod's environment gives configure().

The Helm chart derives `terminationGracePeriodSeconds` from the same values it passes here, so the
pod's environment is the source of truth: a variable that is set overrides what the app's code
passed to configure() (as a command-line flag overrides a config file), with a warning when the two
disagree. An empty variable counts as unset. See docs/chart.md for the full list.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


def _seconds(raw: str) -> float:
    value = float(raw)
    if not value > 0:
        raise ValueError
    return value


def _count_or_off(raw: str) -> int | None:
    """A positive whole number, or 0 meaning 'no limit' (None)."""
    value = int(raw)
    if value < 0:
        raise ValueError
    return value or None


def _names(raw: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in raw.split(",") if name.strip())
    if not names:
        raise ValueError
    return names


@dataclass(frozen=True)
class EnvSetting:
    variable: str
    keyword: str  #: the configure() keyword it sets
    parse: Callable[[str], Any]
    valid: str  #: the valid range, for the error message


ENV_SETTINGS: tuple[EnvSetting, ...] = (
    EnvSetting("TASKHERD_SOFT_TIME_LIMIT", "soft_time_limit", _seconds, "a number of seconds > 0"),
    EnvSetting("TASKHERD_TIME_LIMIT", "time_limit", _seconds, "a number of seconds > 0"),
    EnvSetting("TASKHERD_VISIBILITY_TIMEOUT", "visibility_timeout", _seconds, "a number of seconds > 0"),
    EnvSetting("TASKHERD_MAX_TASKS_PER_CHILD", "max_tasks_per_child", _count_or_off,
               "a whole number >= 0 (0: no limit)"),
    EnvSetting("TASKHERD_MAX_MEMORY_PER_CHILD_KB", "max_memory_per_child_kb", _count_or_off,
               "a whole number of KiB >= 0 (0: no limit)"),
    EnvSetting("TASKHERD_QUEUES", "queues", _names, "a comma-separated list of queue names"),
)

#: Broker URL from the pod's Secret; it replaces the app's broker_url when set.
BROKER_URL_VARIABLE = "TASKHERD_BROKER_URL"


def settings_from_env(environ: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    """(configure keyword -> value, problems) for every contract variable that is set.

    Every problem names the variable, its value and the valid range; none is raised here so that
    configure() can report them together with its own.
    """
    values: dict[str, Any] = {}
    problems: list[str] = []
    for setting in ENV_SETTINGS:
        raw = environ.get(setting.variable, "").strip()
        if not raw:
            continue
        try:
            values[setting.keyword] = setting.parse(raw)
        except ValueError:
            problems.append(f"{setting.variable}={raw!r} is invalid: expected {setting.valid}")
    return values, problems
