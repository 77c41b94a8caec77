"""contract.shown: the one way an error message of the worker, the commands or the operator shows a
value the user wrote — one line, never failing, no password, both ends of a long value kept."""
from __future__ import annotations

import pytest

from taskherd.contract import shown


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("value,expected", [
    ("orders", "'orders'"),
    (5, "5"),
    (True, "True"),
    (None, "None"),
    (1.5e300, "1.5e+300"),
])
def test_a_short_value_is_its_repr(value, expected):
    assert shown(value) == expected


def test_a_long_value_keeps_both_ends_and_says_how_much_went():
    name = "a" * 300 + "-payments"  # two long names that differ only at their end stay told apart
    text = shown(name, 120)
    assert len(text) <= 120
    assert text.startswith("'aaaa") and text.endswith("-payments'")
    assert f"…({len(repr(name)) - 2 * 45} more characters)…" in text


def test_an_int_too_long_for_repr_is_shown_by_its_size():
    huge = 10 ** 5000  # repr() raises ValueError past 4300 digits
    assert shown(huge) == "<an int of 16610 bits, about 10**5000>"
    assert shown(-huge).startswith("<an int of 16610 bits, about -10**")


def test_a_value_repr_cannot_show_is_named_by_its_type():
    class Broken:
        def __repr__(self):
            raise RuntimeError("no")

    assert shown(_nested(100_000)) == "<a list that cannot be shown: RecursionError in repr()>"
    assert shown(Broken()) == "<a Broken that cannot be shown: RuntimeError in repr()>"


def test_redacted_hides_a_password_even_where_the_cut_falls():
    url = "amqp://shop:" + "p" * 400 + "@rabbit/shop"  # the cut would fall inside the password
    text = shown(url, 80, redacted=True)
    assert "ppp" not in text and text == "'amqp://shop:***@rabbit/shop'"
    assert "ppp" in shown(url, 80)  # only when asked: most values hold no URL
