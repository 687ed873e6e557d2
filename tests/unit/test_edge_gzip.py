"""Gzip for streams (`edge.stream.gzip`): who accepts it, and every write readable on its own."""

from __future__ import annotations

import zlib

import pytest

from edge.stream.gzip import Gzip, accepts_gzip


@pytest.mark.parametrize(
    ("header", "accepted"),
    [
        (None, False),
        ("", False),
        ("identity", False),
        ("gzip", True),
        ("gzip, deflate, br, zstd", True),  # httpx, the openai SDK
        ("gzip, deflate, br", True),  # browsers
        ("x-gzip", True),
        ("GZIP;Q=0.5", True),
        ("gzip;q=0", False),
        ("gzip; q=0.0", False),
        ("gzip;q=nan", False),
        ("gzip;q=2", False),
        ("gzip;q=", False),
        ("*", True),
        ("*;q=0", False),
        ("br;q=1, *;q=0", False),
        ("gzip;q=0, *", False),  # named beats the wildcard
        ("*;q=0, gzip;q=0.1", True),
        ("*;q=0.5, *;q=0", True),  # the best of repeated entries
        ("\xe9gzip", False),
    ],
)
def test_accept_encoding_decides(header: str | None, accepted: bool) -> None:
    headers = [] if header is None else [(b"accept-encoding", header.encode("latin-1"))]
    assert accepts_gzip({"type": "http", "headers": [(b"host", b"x"), *headers]}) is accepted


def test_each_write_decodes_whole_as_it_arrives_and_the_last_ends_the_member() -> None:
    gz, inflate = Gzip(), zlib.decompressobj(16 + zlib.MAX_WBITS)
    events = [b'id: t.%d.%d\ndata: {"delta":{"content":"w%d"}}\n\n' % (i, i, i) for i in range(50)]
    wire = [gz.chunk(e) for e in events[:-1]] + [gz.last(events[-1])]
    assert [inflate.decompress(w) for w in wire] == events
    assert inflate.eof and not inflate.unused_data
    # The repeats are within the window: after the first, each event is a few bytes.
    assert max(len(w) for w in wire[1:-1]) < 24 < len(wire[0])
