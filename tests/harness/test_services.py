"""The loopback services as tests, benchmarks and the demo see them (e2e/lib/services.py)."""
import os

import pytest
import redis

from e2e.lib import services
from e2e.lib.envfile import read_env_file


def test_ports_and_credentials_come_from_services_env(monkeypatch):
    for key in ("REDIS_PORT", "RABBITMQ_PORT", "RABBITMQ_MGMT_PORT", "PG_PORT", "ALERTMANAGER_PORT"):
        monkeypatch.delenv(key, raising=False)
    written = read_env_file(services.SERVICES_ENV)
    settings = services.settings()
    assert (settings.redis_port, settings.rabbitmq_port, settings.rabbitmq_management_port, settings.postgres_port,
            settings.alertmanager_port) == tuple(int(written[k]) for k in (
                "REDIS_PORT", "RABBITMQ_PORT", "RABBITMQ_MGMT_PORT", "PG_PORT", "ALERTMANAGER_PORT"))
    assert (settings.user, settings.password) == (written["SERVICE_USER"], written["SERVICE_PASSWORD"])


def test_the_environment_overrides_a_port_as_for_services_sh_and_a_bad_one_is_named(monkeypatch):
    monkeypatch.setenv("REDIS_PORT", "7001")
    assert services.settings().redis_port == 7001
    monkeypatch.setenv("REDIS_PORT", "six")
    with pytest.raises(ValueError, match=r"REDIS_PORT='six' in .*services.env \(or the environment\) must be a port"):
        services.settings()


def test_a_long_lived_holder_keeps_its_database_until_it_releases_it(unique_name):
    base = os.environ["TASKHERD_REDIS_URL"]
    index = services.hold_redis_db(base, unique_name, ttl=60)
    try:
        assert index in services.LEASABLE_DATABASES
        assert services.hold_redis_db(base, unique_name, ttl=60) == index  # the same one again, renewed
        redis.Redis.from_url(base.rsplit("/", 1)[0] + f"/{index}").set("left-by-the-holder", 1)
        with services.leased_redis_db(base) as url:  # a test never gets the held database
            assert not url.endswith(f"/{index}")
    finally:
        assert services.release_redis_db(base, unique_name) == index
    assert redis.Redis.from_url(base.rsplit("/", 1)[0] + f"/{index}").dbsize() == 0  # flushed on release
    assert services.release_redis_db(base, unique_name) is None
