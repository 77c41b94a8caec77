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
