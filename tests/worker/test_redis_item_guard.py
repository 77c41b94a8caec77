"""The guard on what a kombu Redis channel pops (taskherd.compat.guard_redis_items), on the real
Redis, with and without a global_keyprefix, through both ways kombu pops: BRPOP (consuming) and
RPOP (basic_get). An item that is not a kombu message arrives as a message carrying it whole."""
import uuid

import pytest
import redis
from kombu import Connection
from kombu.transport import redis as kombu_redis

from taskherd import compat
from taskherd.worker import redis_items


@pytest.fixture
def guarded_channels():
    before = kombu_redis.Channel._get_client
    compat.guard_redis_items(lambda item, queue: redis_items.guarded(
        item, queue, loads=compat.redis_item_loads, body_codecs=compat.redis_body_codecs()))
    yield
    kombu_redis.Channel._get_client = before


@pytest.mark.parametrize("prefix", ["", "tenant-a:"])
@pytest.mark.parametrize("pop", ["brpop", "rpop"])
def test_an_unreadable_item_arrives_as_a_message_carrying_it(redis_url, guarded_channels, prefix, pop):
    queue = f"guard-{uuid.uuid4().hex[:6]}"
    raw = b"\xffLPUSHed by hand"
    options = {"global_keyprefix": prefix} if prefix else {}
    with Connection(redis_url, transport_options=options) as connection:
        simple = connection.SimpleQueue(queue)
        redis.Redis.from_url(redis_url).lpush(f"{prefix}{queue}", raw)
        message = simple.get(block=True, timeout=5) if pop == "brpop" else simple.get_nowait()
        assert message.body == raw
        assert message.headers[redis_items.UNREADABLE_HEADER].startswith("not valid kombu JSON")
        assert message.content_type == redis_items.UNREADABLE_CONTENT_TYPE
        assert message.delivery_info["routing_key"] == queue
        assert redis.Redis.from_url(redis_url).hlen(f"{prefix}unacked") == 1, "held like any delivery"
        message.ack()
        simple.close()


def test_a_kombu_message_passes_untouched(redis_url, guarded_channels):
    queue = f"guard-{uuid.uuid4().hex[:6]}"
    with Connection(redis_url) as connection:
        simple = connection.SimpleQueue(queue)
        simple.put({"hello": "world"}, headers={"x": 1})
        message = simple.get(block=True, timeout=5)
        assert (message.payload, message.headers) == ({"hello": "world"}, {"x": 1})
        message.ack()
        simple.close()
