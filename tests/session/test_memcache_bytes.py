"""Memcache conformance that needs no server process (behaviour §1, §2, §10.2): exact bytes
from a real session, handler and queue actors of the in-process harness (``tests/helpers.py``:
:class:`World`). Moved from ``tests/server/test_memcache_conformance.py``, which keeps what
needs a socket: drops and closes, stats over the wire, third-party clients, disconnects.
"""

from __future__ import annotations

import os

import pytest

from ..helpers import set_cmd, value


@pytest.fixture
def client(world):
    return world.connect()


def fill(client, queue: str, *items: bytes) -> None:
    assert client.send(b"".join(set_cmd(queue, item) for item in items)) == b"STORED\r\n" * len(items)


@pytest.mark.parametrize("flags", [123, 1, 2147483647, -1, -2147483648])
def test_flags_are_accepted_and_always_returned_as_zero(client, flags):
    assert client.send(b"set q %d 0 3\r\nabc\r\n" % flags) == b"STORED\r\n"
    assert client.send(b"get q\r\n") == value("q", b"abc")


BINARY_PAYLOADS = {
    "crlf-inside": b"line one\r\nline two\r\n",
    "only-crlf": b"\r\n",
    "end-marker": b"\r\nEND\r\nVALUE x 0 1\r\ny",
    "nul-bytes": b"\x00\x00abc\x00",
    "all-bytes": bytes(range(256)),
    "empty": b"",
    "lone-lf": b"\n",
    "one-mib": os.urandom(1 << 20),
}


@pytest.mark.parametrize("name", list(BINARY_PAYLOADS))
def test_binary_payload_round_trips_exactly(client, name):
    data = BINARY_PAYLOADS[name]
    assert client.send(set_cmd("q", data)) == b"STORED\r\n"
    assert client.send(b"get q\r\n") == value("q", data)
    assert client.send(b"get q\r\n") == b"END\r\n"


def test_empty_item_wire_format(client):
    assert client.send(b"set q 0 0 0\r\n\r\n") == b"STORED\r\n"
    assert client.send(b"get q\r\n") == b"VALUE q 0 0\r\n\r\nEND\r\n"


def test_fifo_order_across_1000_items(client):
    items = [b"item-%04d-" % i + os.urandom(i % 7) for i in range(1000)]
    assert client.send(b"".join(set_cmd("q", item) for item in items)) == b"STORED\r\n" * 1000
    assert client.send(b"get q\r\n" * 1000) == b"".join(value("q", item) for item in items)
    assert client.send(b"get q\r\n") == b"END\r\n"


def test_items_from_several_producers_keep_per_producer_order(world):
    a, b, reader = world.connect(), world.connect(), world.connect()
    for i in range(20):
        fill(a, "q", b"a%d" % i)
        fill(b, "q", b"b%d" % i)
    expected = [x for i in range(20) for x in (b"a%d" % i, b"b%d" % i)]
    assert reader.send(b"get q\r\n" * 41) == b"".join(value("q", x) for x in expected) + b"END\r\n"


def test_queue_names_are_case_sensitive(client):
    fill(client, "case", b"lower")
    fill(client, "CASE", b"upper")
    assert client.send(b"get CASE\r\nget case\r\n") == value("CASE", b"upper") + value("case", b"lower")


def test_command_is_case_insensitive(client):
    assert client.send(b"SET q 0 0 2\r\nhi\r\nGeT q\r\nGETS q\r\n") == b"STORED\r\n" + value("q", b"hi") + b"END\r\n"


def test_bare_lf_terminates_a_request_line(client):
    assert client.send(b"set q 0 0 2\nhi\r\nget q\n") == b"STORED\r\n" + value("q", b"hi")


def test_trailing_spaces_are_harmless(client):
    assert client.send(b"set q 0 0 2   \r\nhi\r\nget q   \r\n") == b"STORED\r\n" + value("q", b"hi")


def test_request_split_into_single_bytes(client):
    request = set_cmd("q", b"abc\r\ndef") + b"get q\r\n"
    sent = b"".join(client.send(request[i : i + 1]) for i in range(len(request)))
    assert sent == b"STORED\r\n" + value("q", b"abc\r\ndef")


def test_latin1_queue_name_round_trips(client):
    assert client.send(set_cmd("caf\xe9", b"x")) == b"STORED\r\n"
    assert client.send(b"get caf\xe9\r\n") == value("caf\xe9", b"x")


def test_pipelined_sets_and_gets_from_one_write(client):
    request = b"".join(set_cmd("q", b"%d" % i) + b"get q\r\n" for i in range(200))
    assert client.send(request) == b"".join(b"STORED\r\n" + value("q", b"%d" % i) for i in range(200))


@pytest.mark.parametrize("suffix", ["/t=10", "/t=10/open", "/open/t=10", "/peek", "/peek/t=10", "/foo/bar"])
def test_value_key_is_the_bare_queue_name(client, suffix):
    fill(client, "q", b"hello")
    assert client.send(b"get q%s\r\n" % suffix.encode()) == b"VALUE q 0 5\r\nhello\r\nEND\r\n"


def test_options_work_in_any_order(client):
    fill(client, "q", b"A", b"B", b"C")
    assert client.send(b"get q/t=10/open\r\n") == value("q", b"A")
    assert client.send(b"get q/open/close\r\n") == value("q", b"B")  # confirms A, opens B
    assert client.send(b"get q/close/t=5/open\r\n") == value("q", b"C")  # confirms B, opens C
    assert client.send(b"get q/close\r\n") == b"END\r\n"
    assert client.send(b"get q/peek\r\n") == b"END\r\n"


def test_empty_segment_between_options_is_ignored(client):
    fill(client, "q", b"A")
    assert client.send(b"get q//peek\r\n") == value("q", b"A")
    assert client.send(b"get q\r\n") == value("q", b"A")  # peeked, still there


def test_get_close_returns_end_and_never_an_item(client):
    fill(client, "q", b"A", b"B")
    assert client.send(b"get q/close\r\n" * 3) == b"END\r\n" * 3
    assert client.send(b"get q/open\r\nget q/close\r\nget q/close\r\n") == value("q", b"A") + b"END\r\nEND\r\n"
    assert client.send(b"get q\r\nget q\r\n") == value("q", b"B") + b"END\r\n"


def test_gets_is_an_alias_of_get_without_cas(client):
    fill(client, "q", b"A", b"B")
    reply = client.send(b"gets q\r\ngets q/peek\r\ngets q/open\r\ngets q/close\r\ngets q\r\n")
    assert reply == value("q", b"A") + value("q", b"B") + value("q", b"B") + b"END\r\nEND\r\n"


def test_get_with_two_keys_reads_only_the_first(client):
    fill(client, "a", b"from-a")
    fill(client, "b", b"from-b")
    assert client.send(b"get a b\r\n") == value("a", b"from-a")
    assert client.send(b"get a b\r\n") == b"END\r\n"  # first key empty; the second still not read
    assert client.send(b"get b\r\n") == value("b", b"from-b")


def test_get_missing_key_is_client_error_and_stays_open(client):
    assert client.send(b"get\r\n") == b"CLIENT_ERROR\r\n"
    assert not client.transport.closed
    assert client.send(b"version\r\n") == b"VERSION test\r\n"


def test_zero_or_negative_timeout_does_not_wait(client):
    """Both ENDs are there once the session has run to quiet: neither read waited (a waiting
    read would have answered nothing yet)."""
    assert client.send(b"get q/t=0\r\nget q/t=-500\r\n") == b"END\r\nEND\r\n"
