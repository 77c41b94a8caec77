"""Fixtures every test shares: the real services started by `scripts/services.sh up`.
(The cluster's fixtures come from the plugin e2e/lib/pytest_plugin.py.)

A service that is not reachable is a failure with the reason, never a skip: `make test` starts
them, so an unreachable one means setup is broken.
Isolation, so that tests never see each other's messages even when several run at once:
Redis tests lease a whole database index, RabbitMQ tests get a fresh vhost, PostgreSQL tests a
fresh database.
"""
from __future__ import annotations

import os
import uuid

import pytest

from e2e.lib import services


def _required_env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set: run the tests through `make test` (it starts the services)")
    return value


@pytest.fixture(autouse=True)
def _restore_environment():
    """Whatever a test (or code it drives in-process) puts in os.environ goes away after it:
    configure() reads TASKHERD_* variables, so one leaked variable would reconfigure every later test."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def unique_name(request) -> str:
    """A name no other test uses: for queues, keys and task names."""
    base = "".join(c if c.isalnum() else "-" for c in request.node.name)[:40].strip("-")
    return f"t-{base}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def redis_url() -> str:
    """A Redis URL on a database index leased to this test alone and flushed before use."""
    base = _required_env("TASKHERD_REDIS_URL")
    with services.leased_redis_db(base) as url:
        yield url


@pytest.fixture
def amqp_url() -> str:
    """An AMQP URL on a fresh RabbitMQ vhost, deleted afterwards."""
    base = _required_env("TASKHERD_AMQP_URL")
    api = _required_env("TASKHERD_RABBITMQ_API_URL")
    with services.fresh_vhost(base, api) as url:
        yield url


@pytest.fixture
def rabbitmq_api_url() -> str:
    return _required_env("TASKHERD_RABBITMQ_API_URL")


@pytest.fixture
def pg_dsn() -> str:
    """A DSN for a fresh PostgreSQL database, dropped afterwards."""
    base = _required_env("TASKHERD_PG_DSN")
    with services.fresh_database(base) as dsn:
        yield dsn


@pytest.fixture(params=["redis", "rabbitmq"])
def broker_url(request) -> str:
    """Parametrises a test over both brokers."""
    return request.getfixturevalue("redis_url" if request.param == "redis" else "amqp_url")


@pytest.fixture
def worker_factory(tmp_path):
    """Starts real `celery worker` processes; every one still running is killed at teardown."""
    from support.worker_process import WorkerProcess

    started: list[WorkerProcess] = []

    def start(app_module: str, **kwargs) -> WorkerProcess:
        worker = WorkerProcess(app_module, log_dir=tmp_path, **kwargs)
        started.append(worker)
        worker.start()
        return worker

    yield start
    for worker in started:
        worker.kill()
