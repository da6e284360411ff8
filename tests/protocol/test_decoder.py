"""What the three decoders share through ``protocol.Decoder``: input kept across reads however it
is cut (bytes parsed in place, or a bytearray), and a decoder spent after a closing command."""

from __future__ import annotations

import pytest

from kestrel_actors import protocol as p
from kestrel_actors.client.thrift import encode_call
from kestrel_actors.protocol import MemcacheDecoder, TextDecoder, ThriftDecoder

DROP = p.Bad(None, close=True)

# (decoder, a stream of three requests, the same stream ending in one that closes)
STREAMS = {
    "memcache": (
        MemcacheDecoder,
        b"set q 0 0 5\r\nhello\r\nget q/t=10/open\r\nversion\r\n",
        b"get q\r\nset q 0 0 x\r\n",
    ),
    "text": (TextDecoder, b"put q:\nitem\n\nget q 10\nversion\n", b"get q\n   \n"),
    "thrift": (
        ThriftDecoder,
        encode_call("put", 1, queue_name="q", items=[b"a"])
        + encode_call("peek", 2, queue_name="q")
        + encode_call("get_version", 3),
        encode_call("peek", 4, queue_name="q") + b"\xff\xff\xff\xff",
    ),
}


@pytest.fixture(params=sorted(STREAMS))
def protocol(request):
    return STREAMS[request.param]


def test_every_cut_and_every_input_type_gives_the_same_commands(protocol):
    make, stream, _ = protocol
    expected = make().feed(stream)
    assert len(expected) == 3 and not any(type(c) is p.Bad for c in expected)
    for cut in range(len(stream) + 1):
        for kind in (bytes, bytearray):
            decoder = make()
            got = decoder.feed(kind(stream[:cut])) + decoder.feed(kind(stream[cut:]))
            assert got == expected, (cut, kind)


def test_fed_a_byte_at_a_time_nothing_is_lost(protocol):
    make, stream, _ = protocol
    decoder = make()
    got: list[object] = []
    for i in range(len(stream)):
        got += decoder.feed(stream[i : i + 1])
    assert got == make().feed(stream)


def test_spent_after_a_closing_command(protocol):
    make, stream, closing = protocol
    decoder = make()
    got = decoder.feed(closing + stream)
    assert len(got) == 2 and got[-1] == DROP
    assert decoder.closed
    assert decoder.feed(stream) == []
