"""The queue inspections of one broker asked for together go out as one call (group commit).

Most WorkerPools of a cluster share a few brokers, and the scheduler polls up to 16 pools at once.
A pool's request waits while an inspection of its broker runs; the requests that gathered
meanwhile then go out together, as one `inspect` call over the union of their queues: one Redis
pipeline (on RabbitMQ one reading of the vhost's listing) and one worker thread for the batch
instead of one per pool. No pool gets queue figures
older than its request: a batch always starts after every request in it was made. (The broker's
unacknowledged deliveries are the exception, on purpose: the observer reads them at most once a
second for all batches, broker.UNACKED_MAX_AGE_SECONDS.) On either broker the figures of one queue
do not depend on the other queues of the call, so batching changes no figure.

Errors stay with the pools they concern:
- `BrokerUnreachable` (the broker itself: refused, timed out) reaches every pool of the batch,
  which all asked that broker and would each have met it;
- any other error may be one queue's doing (a key of the wrong type), so a batch of several
  pools that meets one is sent again one pool at a time, and the error reaches only its pool.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Awaitable, Callable, Mapping

from taskherd.queues.stats import BrokerUnreachable

if TYPE_CHECKING:
    from taskherd.queues import QueueStats


@dataclass(frozen=True)
class BrokerAddress:
    """What one inspection call is made with, apart from the queues: requests with equal
    addresses can share a call."""

    url: str
    management_url: str | None = None
    global_keyprefix: str = ""
    #: the other URLs of a ';'-joined failover list, in their order (broker.BrokerObserver tries
    #: them when ``url`` does not answer)
    failover: tuple[str, ...] = ()

    @property
    def urls(self) -> tuple[str, ...]:
        return (self.url,) + self.failover


InspectFn = Callable[[BrokerAddress, list[str]], Awaitable[Mapping[str, "QueueStats"]]]


@dataclass(frozen=True)
class _Request:
    queues: tuple[str, ...]
    result: asyncio.Future


class InspectionBatcher:
    def __init__(self, inspect: InspectFn) -> None:
        self._inspect = inspect
        self._waiting: dict[BrokerAddress, list[_Request]] = {}
        #: one task per broker with requests, sending its batches one after the other
        self._senders: dict[BrokerAddress, asyncio.Task] = {}

    async def inspect(self, address: BrokerAddress, queues: list[str]) -> Mapping[str, "QueueStats"]:
        """The stats of `queues`, from a call that started after this request."""
        request = _Request(tuple(queues), asyncio.get_running_loop().create_future())
        self._waiting.setdefault(address, []).append(request)
        if address not in self._senders:
            # Starts on the next turn of the event loop: the polls started in the same round ask first.
            self._senders[address] = asyncio.create_task(self._send_batches(address))
        return await request.result

    async def _send_batches(self, address: BrokerAddress) -> None:
        try:
            while batch := self._waiting.pop(address, None):
                await self._send(address, batch)
        finally:
            del self._senders[address]

    async def _send(self, address: BrokerAddress, batch: list[_Request]) -> None:
        queues = list(dict.fromkeys(q for request in batch for q in request.queues))
        try:
            stats = await self._inspect(address, queues)
        except BrokerUnreachable as exc:
            for request in batch:
                _settle(request, exception=exc)
        except Exception as exc:  # noqa: BLE001 - given to the requests, as the call would have raised it
            if len(batch) == 1:
                _settle(batch[0], exception=exc)
            else:  # whose queue was it? each pool alone finds out
                await asyncio.gather(*(self._send(address, [request]) for request in batch))
        else:
            for request in batch:
                _settle(request, stats={q: stats[q] for q in request.queues if q in stats})


def _settle(request: _Request, *, stats: Mapping[str, "QueueStats"] | None = None,
            exception: BaseException | None = None) -> None:
    if request.result.done():  # the poll was cancelled (its pool deleted) while it waited
        return
    if exception is not None:
        request.result.set_exception(exception)
    else:
        request.result.set_result(stats)
