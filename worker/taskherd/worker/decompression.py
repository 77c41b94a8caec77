"""kombu's decompression, bounded: a compressed body is inflated to at most MAX_DECOMPRESSED_BYTES.

kombu inflates a message's body (its ``compression`` header: gzip/zlib, bzip2, lzma) in the
worker's main process as the message arrives, whole, with no limit: 300 KB of zlib becomes 300 MB
there and again in the pool child, and a larger one gets the main process killed for memory. With
fast recovery the next worker then takes the same message and dies too, and the delivery count
(kept in the pool child) never sees it run: a poison message no bound stops.

Bounded, a body that would inflate past the limit fails to decompress, which kombu records as the
message's decode error: the worker dead-letters it (``undecodable-message``, the limit named) and
goes on. The decoders are kombu's process-wide registry, replaced for the content types kombu
itself registers, so every consumer of the worker is covered; compressing (publishing) is left
as it is.
"""
from __future__ import annotations

import bz2
import lzma
import zlib
from typing import Any, Callable

from kombu import compression

#: The largest body a worker inflates: 128 MiB, the largest message RabbitMQ 3.8–3.13 takes by
#: default (max_message_size; 16 MiB from 4.0): a body no broker would carry uncompressed is no
#: task's, and the main process holds it whole while it decodes it.
MAX_DECOMPRESSED_BYTES = 128 * 1024 * 1024

#: kombu's compression content types -> the streaming decompressor of each (kombu decodes them
#: with zlib.decompress, bz2.decompress and lzma.decompress)
_DECOMPRESSORS: dict[str, Callable[[], Any]] = {
    "application/x-gzip": zlib.decompressobj,
    "application/x-bz2": bz2.BZ2Decompressor,
    "application/x-lzma": lzma.LZMADecompressor,
}


class BodyTooLarge(ValueError):
    """A compressed body that inflates past the limit."""


def bounded(make: Callable[[], Any], limit: int = MAX_DECOMPRESSED_BYTES) -> Callable[[bytes], bytes]:
    """A decoder like kombu's that stops at ``limit`` bytes of output instead of going on."""

    def decode(body: bytes) -> bytes:
        decompressor = make()
        inflated = decompressor.decompress(body, limit + 1)
        if len(inflated) > limit:
            raise BodyTooLarge(f"the body inflates to more than {limit} bytes "
                               f"(valid: at most {limit} bytes once decompressed)")
        if not decompressor.eof:  # zlib.decompress says so too; a decompressobj only stops
            raise ValueError("the compressed body is incomplete or truncated")
        return inflated

    return decode


def install(limit: int = MAX_DECOMPRESSED_BYTES) -> None:
    """Replaces kombu's decoders of its own content types with bounded ones (idempotent)."""
    for content_type, make in _DECOMPRESSORS.items():
        encoder = compression._encoders.get(content_type)
        if encoder is not None:  # kombu registered it; aliases ('gzip', 'zlib', …) map to it already
            compression.register(encoder, bounded(make, limit), content_type)
