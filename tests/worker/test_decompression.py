"""The worker's decoders of compressed bodies stop at a bound instead of inflating whatever comes
(the corpus in test_message_corpus.py sends a real bomb to a real worker)."""
from __future__ import annotations

import bz2
import lzma
import zlib

import pytest
from kombu import compression

from taskherd.worker import decompression

KINDS = [("application/x-gzip", zlib.compress, zlib.decompressobj),
         ("application/x-bz2", bz2.compress, bz2.BZ2Decompressor),
         ("application/x-lzma", lzma.compress, lzma.LZMADecompressor)]


@pytest.mark.parametrize("content_type,compress,make", KINDS, ids=[k[0] for k in KINDS])
def test_a_body_up_to_the_bound_inflates_as_kombu_would_and_one_byte_more_is_refused(content_type, compress, make):
    decode = decompression.bounded(make, 1000)
    assert decode(compress(b"x" * 1000)) == b"x" * 1000
    with pytest.raises(decompression.BodyTooLarge, match=r"inflates to more than 1000 bytes \(valid: at most 1000"):
        decode(compress(b"x" * 1001))


@pytest.mark.parametrize("content_type,compress,make", KINDS, ids=[k[0] for k in KINDS])
def test_a_truncated_or_garbled_body_is_an_error_as_with_kombu(content_type, compress, make):
    decode = decompression.bounded(make, 1000)
    with pytest.raises(ValueError, match="incomplete or truncated"):
        decode(compress(b"x" * 500)[:-4])  # a decompressobj stops quietly where zlib.decompress raised
    with pytest.raises(Exception):
        decode(b"\xff\xfe not compressed")


def test_install_replaces_kombus_decoders_for_every_alias_and_leaves_compressing_alone():
    decompression.install(1000)
    try:
        for alias, compress in (("gzip", zlib.compress), ("zlib", zlib.compress), ("bzip2", bz2.compress),
                                ("xz", lzma.compress), ("lzma", lzma.compress)):
            assert compression.decompress(compress(b"x" * 1000), alias) == b"x" * 1000
            with pytest.raises(decompression.BodyTooLarge):
                compression.decompress(compress(b"x" * 1001), alias)
        body, content_type = compression.compress(b"task", "zlib")
        assert content_type == "application/x-gzip" and compression.decompress(body, content_type) == b"task"
    finally:
        decompression.install()  # the worker's bound, for whatever else runs in this process
