"""contract.redact: the one redaction of a URL's password, for errors, logs, the status and Events."""
from __future__ import annotations

import pytest

from taskherd.contract import redact


@pytest.mark.parametrize("text,shown", [
    ("Redis at redis://:hunter2@redis:6379/0: refused", "Redis at redis://:***@redis:6379/0: refused"),
    # the user name stays: it tells which account was refused
    ("amqp://user:pw@rabbit// and https://a:b@hook/x", "amqp://user:***@rabbit// and https://a:***@hook/x"),
    # a user-info without ':' may be a token: hidden whole
    ("redis://s3cr3t-token@cache:6379/0", "redis://***@cache:6379/0"),
    # passwords written unescaped, as a base64 secret is: '/', '+', '=' and '@'
    ("Redis at redis://:ab/cd+e==@redis:6379/0: refused", "Redis at redis://:***@redis:6379/0: refused"),
    ("amqp://u:abc/def+g==@h/v", "amqp://u:***@h/v"),
    ("'amqp://shop:p@ss@rabbit/shop';'amqp://shop:x/y@rabbit2/shop'",
     "'amqp://shop:***@rabbit/shop';'amqp://shop:***@rabbit2/shop'"),
    # an '@' in the user name, unescaped: the user-info is hidden whole rather than shown in part
    ("amqp://me@example.org:pw@rabbit//", "amqp://***@rabbit//"),
    ("no URL here, but mail@example.org", "no URL here, but mail@example.org"),
    ("amqp://rabbit:5672/shop", "amqp://rabbit:5672/shop"),
    ("inspected 2 queues", "inspected 2 queues"),
])
def test_redact_hides_the_password_of_every_url(text, shown):
    assert redact(text) == shown
