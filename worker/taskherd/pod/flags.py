"""A tiny `--flag value` parser for the commands Kubernetes runs in every pod (`taskherd probe`,
`taskherd drain`): argparse alone costs more than a whole probe. Standard library only."""
from __future__ import annotations

import sys

from taskherd import contract


def parse_flags(argv: list[str], names: dict[str, str], options: dict[str, object]) -> dict[str, object]:
    """Sets ``options[names[flag]]`` from ``--flag value`` or ``--flag=value`` (as strings).

    Raises ValueError naming an unknown flag or a flag without its value.
    """
    rest = list(argv)
    while rest:
        flag, *rest = rest
        name, _, value = flag.partition("=")
        key = names.get(name)
        if key is None:
            raise ValueError(f"unknown option {name!r}")
        if not value:
            if not rest:
                raise ValueError(f"option {name} needs a value")
            value, *rest = rest
        options[key] = value
    return options


def seconds(name: str, value: object, *, zero_allowed: bool = False, maximum: float = contract.MAX_SECONDS) -> float:
    """``value`` as a number of seconds > 0 (>= 0 with ``zero_allowed``) and <= ``maximum``, or
    ValueError naming ``name`` and the valid range.

    The bound is the commands' (taskherd.commands.options.seconds, contract.MAX_SECONDS: a week), or
    that of the flag's variable (--deadline: TASKHERD_DRAIN_DEADLINE, contract.MAX_DRAIN_SECONDS):
    larger values are typos, and time.sleep overflows on them (--poll 1e10: OverflowError after
    drain-request.json was written)."""
    valid = contract.seconds_valid(int(maximum))
    if zero_allowed:
        valid = valid.replace("> 0", ">= 0", 1)
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r} is not a number of seconds (valid: {valid})") from None
    # not (number >= 0): nan compares false with everything; --max-age nan would make liveness never fail
    if not (number >= 0) or not (number <= maximum) or (number == 0 and not zero_allowed):
        raise ValueError(f"{name}={value!r} must be a positive number of seconds{' or 0' if zero_allowed else ''} "
                         f"(finite: not nan or inf; valid: {valid})")
    return number


def command_line(name: str, usage: str, parse, argv: list[str]):
    """(parse(argv), None), or (None, exit status) once usage was printed: 0 for -h/--help, 2 for
    a usage error (``parse`` raised ValueError, named in the message)."""
    if "-h" in argv or "--help" in argv:
        print(usage)
        return None, 0
    try:
        return parse(argv), None
    except ValueError as exc:
        print(f"taskherd {name}: {exc}\n{usage}", file=sys.stderr)
        return None, 2
