"""Transient vs permanent classification, including HTTP clients recognised without importing them."""
import socket
import types

import httpx
import pytest

from taskherd.worker.transient import PermanentError, TransientError, make_classifier

classify = make_classifier().is_transient


def _fake_client_error(module: str, name: str, **attrs) -> BaseException:
    """An exception class living in `module` (a client we need not have installed)."""
    cls = type(name, (Exception,), {"__module__": module})
    exc = cls("boom")
    for key, value in attrs.items():
        setattr(exc, key, value)
    return exc


@pytest.mark.parametrize("exc", [ConnectionResetError(), ConnectionRefusedError(), TimeoutError(),
                                 socket.timeout(), socket.gaierror(), TransientError("x")])
def test_network_and_timeout_errors_are_transient(exc):
    assert classify(exc)


@pytest.mark.parametrize("exc", [ValueError("bad"), KeyError("k"), FileNotFoundError(), PermissionError(),
                                 PermanentError("x"), TypeError()])
def test_input_and_programming_errors_are_permanent(exc):
    assert not classify(exc)


@pytest.mark.parametrize("status,transient", [(429, True), (500, True), (502, True), (503, True), (504, True),
                                              (400, False), (404, False), (422, False)])
def test_http_status_errors_from_each_client(status, transient):
    response = types.SimpleNamespace(status_code=status)
    for exc in (_fake_client_error("requests.exceptions", "HTTPError", response=response),
                _fake_client_error("aiohttp.client_exceptions", "ClientResponseError", status=status),
                _fake_client_error("urllib3.exceptions", "ResponseError", status=status)):
        assert classify(exc) is transient, exc


def test_a_real_httpx_status_error():
    request = httpx.Request("GET", "http://example.invalid/")
    for status, transient in ((503, True), (429, True), (404, False)):
        exc = httpx.HTTPStatusError("x", request=request, response=httpx.Response(status, request=request))
        assert classify(exc) is transient


def test_client_connection_errors_without_status_are_transient():
    assert classify(httpx.ConnectTimeout("slow"))
    assert classify(_fake_client_error("requests.exceptions", "ConnectionError"))
    assert classify(_fake_client_error("aiohttp.client_exceptions", "ServerDisconnectedError"))
    assert not classify(_fake_client_error("requests.exceptions", "InvalidURL"))


def test_configured_classes_add_to_the_defaults_and_permanent_wins():
    class Flaky(Exception):
        pass

    class Refused(ConnectionError):
        pass

    custom = make_classifier(transient=[Flaky], permanent=[Refused]).is_transient
    assert custom(Flaky()) and custom(ConnectionResetError())
    assert not custom(Refused())
    assert not make_classifier(transient=[Flaky], replace_defaults=True).is_transient(ConnectionResetError())
    with pytest.raises(TypeError, match="transient_errors"):
        make_classifier(transient=["ValueError"])


def test_real_aiohttp_and_urllib3_errors():
    import aiohttp
    import urllib3.exceptions

    info = aiohttp.RequestInfo(url=__import__("yarl").URL("http://x/"), method="GET", headers={}, real_url=None)
    assert classify(aiohttp.ClientResponseError(info, (), status=503))
    assert classify(aiohttp.ClientResponseError(info, (), status=429))
    assert not classify(aiohttp.ClientResponseError(info, (), status=400))
    assert classify(aiohttp.ServerDisconnectedError())
    assert classify(urllib3.exceptions.NewConnectionError(None, "refused"))
    assert classify(urllib3.exceptions.ReadTimeoutError(None, "/", "read timed out"))
    assert not classify(urllib3.exceptions.LocationParseError("::bad"))


def test_real_database_and_cache_connection_errors_are_transient_and_their_data_errors_are_not():
    import psycopg
    import redis

    classifier = make_classifier()
    with pytest.raises(psycopg.OperationalError) as lost_database:
        psycopg.connect("postgresql://nobody@127.0.0.1:1/none", connect_timeout=2)
    with pytest.raises(redis.ConnectionError) as lost_cache:
        redis.Redis(port=1, socket_connect_timeout=2).ping()
    assert classifier.is_transient(lost_database.value)
    assert classifier.is_transient(lost_cache.value)
    assert classifier.is_transient(psycopg.errors.DeadlockDetected("deadlock detected"))
    assert not classifier.is_transient(psycopg.errors.UniqueViolation("duplicate key"))
    assert not classifier.is_transient(redis.ResponseError("WRONGTYPE"))


def _real_psycopg_error():
    import psycopg

    try:
        psycopg.connect("postgresql://taskherd@127.0.0.1:1/nowhere", connect_timeout=2)
    except psycopg.OperationalError as exc:
        return exc
    raise AssertionError("connecting to port 1 succeeded")


def test_a_driver_error_wrapped_by_an_orm_is_judged_by_the_driver_error():
    driver_error = _real_psycopg_error()

    class OperationalError(Exception):  # django.db.utils.OperationalError: raised `from` the driver's
        pass

    try:
        raise OperationalError(str(driver_error)) from driver_error
    except OperationalError as django_style:
        assert classify(django_style)

    class DBAPIError(Exception):  # sqlalchemy.exc.OperationalError: the driver's error in .orig
        def __init__(self, orig):
            super().__init__(str(orig))
            self.orig = orig

    assert classify(DBAPIError(driver_error))
    assert not classify(DBAPIError(ValueError("bad literal")))


def test_an_error_raised_while_handling_a_transient_one_is_a_new_failure():
    try:
        try:
            raise ConnectionResetError("upstream reset")
        except ConnectionResetError:
            raise ValueError("order 42 is invalid")  # __context__ only: the code's own verdict
    except ValueError as exc:
        assert exc.__context__ is not None and not classify(exc)
    wrapped_permanent = RuntimeError("wrapper")
    wrapped_permanent.__cause__ = PermanentError("no")
    assert not classify(wrapped_permanent)


def test_a_wrapping_cycle_ends():
    first, second = RuntimeError("a"), RuntimeError("b")
    first.__cause__, second.__cause__ = second, first
    assert not classify(first)


def test_a_write_to_a_redis_replica_during_a_failover_is_transient(tmp_path):
    """A replica answers writes with READONLY (redis-py's ReadOnlyError) until clients follow the new
    primary: a real replica of a private redis-server here."""
    import redis

    from support.private_redis import private_redis

    with private_redis(tmp_path / "primary") as (primary_url, _):
        port = primary_url.split(":")[2].split("/")[0]
        with private_redis(tmp_path / "replica", "--replicaof", "127.0.0.1", port) as (replica_url, _):
            with pytest.raises(redis.exceptions.ReadOnlyError) as raised:
                redis.Redis.from_url(replica_url).set("k", "v")
    assert classify(raised.value)


def test_retry_after_is_read_through_the_wrapping():
    from taskherd.worker.idempotency import InProgress
    from taskherd.worker.transient import retry_after

    busy = InProgress("charge:1", retry_after=12.5)
    wrapper = RuntimeError("wrapped")
    wrapper.__cause__ = busy
    assert retry_after(busy) == 12.5 and retry_after(wrapper) == 12.5
    assert retry_after(ValueError("x")) is None
