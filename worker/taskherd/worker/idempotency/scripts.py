"""The Redis store's Lua scripts, run over one connection per thread.

Why not `client.register_script`: every redis-py command goes through a connection-pool checkout
(with a readability poll), retry wrappers, event dispatch and observability hooks — measured
here at about 50 µs of CPU per command, more than the command's own socket work. The guard makes
two commands per task, so that machinery was the larger part of its cost (bench/throughput.py).
Sending the script on a connection this thread owns skips it. Clients without a connection pool
(cluster clients and the like) take redis-py's ordinary path.

``socket_timeout`` overrides the client's own (often none) on these connections: the lease
renewals use it, so that one Redis that stops answering cannot hang the renewing thread.
"""
from __future__ import annotations

import hashlib
import os
import threading
from typing import Any, Callable, Sequence

from redis.exceptions import ConnectionError, NoScriptError, TimeoutError


class Scripts:
    def __init__(self, client, *, socket_timeout: float | None = None):
        self._client = client
        self._pool = getattr(client, "connection_pool", None)
        self._socket_timeout = socket_timeout
        self._local = threading.local()

    def register(self, source: str) -> Callable[..., Any]:
        """A callable `script(keys=[...], args=[...])` returning the script's reply."""
        if self._pool is None or not hasattr(self._pool, "make_connection"):
            return self._client.register_script(source)
        sha = hashlib.sha1(source.encode()).hexdigest()

        def call(keys: Sequence = (), args: Sequence = ()) -> Any:
            for attempt in (1, 2):
                connection = self._connection()
                try:
                    connection.send_command("EVALSHA", sha, len(keys), *keys, *args)
                    return connection.read_response()
                except NoScriptError:  # the server's script cache is empty (restart, SCRIPT FLUSH)
                    connection.send_command("EVAL", source, len(keys), *keys, *args)
                    return connection.read_response()
                except (ConnectionError, TimeoutError) as exc:
                    connection.disconnect()
                    # Once more on a fresh connection, as redis-py's default retry would: a
                    # connection idle since the last task may have been closed by the server.
                    # Every script of the store is safe to run twice (see redis_store.py).
                    if attempt == 2:
                        raise exc
                except BaseException:
                    # The reply may still be in flight: never reuse a connection in an unknown state.
                    connection.disconnect()
                    raise

        return call

    def _connection(self):
        local = self._local
        if getattr(local, "pid", None) != os.getpid():  # new thread, or a forked child
            local.pid, local.connection = os.getpid(), self._new_connection()
        return local.connection

    def _new_connection(self):
        if self._socket_timeout is None:
            return self._pool.make_connection()
        options = {**self._pool.connection_kwargs, "socket_timeout": self._socket_timeout,
                   "socket_connect_timeout": self._socket_timeout}
        return self._pool.connection_class(**options)
