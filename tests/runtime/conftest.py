"""Fixtures of the runtime tests (heartbeat, probes, drain, metrics)."""
import pytest

from support.private_redis import PrivateRedis


@pytest.fixture
def private_redis(tmp_path):
    """A redis-server of this test alone, stopped and restarted at will (killed by PID)."""
    server = PrivateRedis(tmp_path)
    server.start()
    yield server
    server.stop()
