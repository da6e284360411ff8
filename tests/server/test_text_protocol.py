"""Kestrel's text protocol on ``--text-port`` (behaviour §3, §10.15): exact bytes on the wire.

Every test talks to a real ``kestrel-actors serve`` process. The replies end in ``\\n`` only:
``+<n>`` a count, ``-<message>`` an error (the connection stays open), ``:<data>`` an item or a
string, ``*`` no item. Text fetches are always transactional: an item stays open until the
next get/peek/monitor on the same queue, or ``confirm``; disconnecting returns it.

Tests sharing ``text_server`` use queue names no other test uses.
"""

from __future__ import annotations

import time

import pytest

from kestrel_actors import KESTREL_VERSION

from ..helpers import PATIENCE, start_text_server, text_client, wait_for

TEXT_CONFIG = """\
[queues.tfanout]
fanout_only = true

[queues.talfull]
max_items = 1

[aliases]
talias = ["tal1", "tal2"]
tpart = ["tal3", "talfull"]
"""


@pytest.fixture(scope="module")
def text_server(tmp_path_factory):
    base = tmp_path_factory.mktemp("text")
    config = base / "kestrel.toml"
    config.write_text(TEXT_CONFIG)
    server = start_text_server(
        base / "data", "--config", str(config), "--max-open-transactions", "2",
        "--expiration-timer-frequency", "0",
    )
    yield server
    server.stop()


@pytest.fixture
def t(text_server):
    client = text_client(text_server)
    yield client
    client.close()


@pytest.fixture
def m(text_server):
    client = text_server.client()
    yield client
    client.close()


# -- the behaviour §10.15 transcript ----------------------------------------------------------------------


def test_put_get_transcript(t, m):
    assert t.put("tq", b"A", b"B") == b"+2"
    assert t.call(b"get tq") == b":A"
    assert m.stats()["queue_tq_open_transactions"] == "1"
    assert t.call(b"get tq") == b":B"  # confirms A first
    stats = m.stats()
    assert stats["queue_tq_open_transactions"] == "1"
    assert stats["queue_tq_items"] == "0"
    assert t.call(b"get tq") == b"*"  # confirms B
    stats = m.stats()
    assert stats["queue_tq_open_transactions"] == "0"
    assert stats["queue_tq_total_items"] == "2"


def test_exact_bytes_of_a_put_and_a_get(t):
    t.send(b"put tbytes:\nhello world\n\nget tbytes\nget tbytes\n")
    expected = b"+1\n:hello world\n*\n"
    data = b""
    t.sock.settimeout(PATIENCE)
    while len(data) < len(expected):
        chunk = t.sock.recv(1024)
        assert chunk, data
        data += chunk
    assert data == expected
    assert t.silent()


def test_crlf_requests_are_accepted(t):
    t.send(b"put tcrlf:\r\nX\r\n\r\n")
    assert t.read_line() == b"+1"
    assert t.call(b"get tcrlf\r") == b":X"


def test_peek_returns_the_head_without_removing_it(t, m):
    assert t.put("tpeek", b"C", b"D") == b"+2"
    assert t.call(b"peek tpeek") == b":C"
    assert t.call(b"peek tpeek") == b":C"
    assert m.stats()["queue_tpeek_items"] == "2"
    assert t.call(b"get tpeek") == b":C"
    assert t.call(b"peek tpeek") == b":D"  # confirms C, leaves D
    stats = m.stats()
    assert stats["queue_tpeek_items"] == "1"
    assert stats["queue_tpeek_open_transactions"] == "0"
    assert t.call(b"peek tempty") == b"*"


def test_get_with_a_timeout_waits_for_an_item(text_server, t):
    """``get q 300`` answers ``*`` no sooner than 300 ms; a longer wait takes the item put
    meanwhile."""
    started = time.monotonic()
    assert t.call(b"get twait 300") == b"*"
    assert time.monotonic() - started >= 0.29
    t.send(b"get twait 60000\n")
    other = text_client(text_server)
    time.sleep(0.1)
    assert other.put("twait", b"late") == b"+1"
    assert t.read_line() == b":late"
    other.close()


def test_confirm(t, m):
    assert t.put("tconf", b"1", b"2", b"3") == b"+3"
    assert t.call(b"get tconf") == b":1"
    assert t.call(b"confirm tconf 1") == b"+1"
    assert t.call(b"confirm tconf 1") == b"-Not that many transactions open."
    assert t.call(b"confirm tconf 0") == b"-Not that many transactions open."
    assert t.call(b"confirm tconf") == b"-Queue name & count required."
    assert t.call(b"get tconf") == b":2"  # nothing left to confirm first
    assert m.stats()["queue_tconf_items"] == "1"
    assert t.call(b"confirm tconf 1") == b"+1"
    stats = m.stats()
    assert stats["queue_tconf_open_transactions"] == "0"
    assert stats["queue_tconf_items"] == "1"


def test_monitor_streams_opened_items_then_star(t, m):
    """The stream stops at ``max_open_transactions`` (2 here) items, then ``*``."""
    assert t.put("tmon", b"A", b"B", b"C") == b"+3"
    t.send(b"monitor tmon 60000\n")
    # stopped at the limit, not the minute-long deadline (the client's patience is shorter)
    assert [t.read_line() for _ in range(3)] == [b":A", b":B", b"*"]
    assert m.stats()["queue_tmon_open_transactions"] == "2"
    assert t.call(b"confirm tmon 2") == b"+2"
    started = time.monotonic()
    t.send(b"monitor tmon 300\n")  # one item, then the deadline
    assert t.read_line() == b":C"
    assert t.read_line() == b"*"
    assert time.monotonic() - started >= 0.29
    assert t.call(b"monitor tmon") == b"-Queue name & timeout required."
    assert t.call(b"monitor tmon 100") == b"*"  # confirms C, then nothing arrives
    stats = m.stats()
    assert stats["queue_tmon_open_transactions"] == "0"
    assert stats["queue_tmon_items"] == "0"


def test_flush_replies_plus_zero_and_empties(t, m):
    assert t.put("tflush", b"1", b"2") == b"+2"
    assert t.call(b"flush tflush") == b"+0"
    assert m.stats()["queue_tflush_items"] == "0"
    assert t.call(b"get tflush") == b"*"


def test_delete_replies_plus_zero_and_removes_the_queue(t, m):
    assert t.put("tdel", b"1") == b"+1"
    assert "queue_tdel_items" in m.stats()
    assert t.call(b"delete tdel") == b"+0"
    assert "queue_tdel_items" not in m.stats()
    assert t.call(b"delete tdelnosuch") == b"+0"


def test_version(t):
    assert t.call(b"version") == b":" + KESTREL_VERSION.encode()


@pytest.mark.parametrize(("request_line", "reply"), [
    (b"x", b"-Unknown command: x"),
    (b"FOO bar", b"-Unknown command: foo"),
    (b"stats", b"-Unknown command: stats"),
    (b"", b"-Unknown command: "),
])
def test_unknown_command_is_an_error_and_the_connection_stays_open(t, request_line, reply):
    assert t.call(request_line) == reply
    assert t.call(b"version") == b":" + KESTREL_VERSION.encode()


@pytest.mark.parametrize(("request_line", "reply"), [
    (b"get", b"-Queue name required."),
    (b"put:", b"-Queue name required."),
    (b"get terr abc", b"-Error parsing timeout."),
])
def test_argument_errors(t, request_line, reply):
    if request_line.endswith(b":"):
        t.send(request_line + b"\nitem\n\n")
        assert t.read_line() == reply
    else:
        assert t.call(request_line) == reply
    assert t.call(b"version") == b":" + KESTREL_VERSION.encode()


def test_put_with_a_bad_expiry(t):
    t.send(b"put tbadexp soon:\nx\n\n")
    assert t.read_line() == b"-Error parsing expiration time."
    assert t.call(b"get tbadexp") == b"*"


def test_put_with_expiry_zero_expires_at_once(t, m):
    assert t.put("texp0", b"gone", expiry=0) == b"+1"
    time.sleep(0.01)
    assert t.call(b"get texp0") == b"*"
    assert m.stats()["queue_texp0_expired_items"] == "1"


def test_put_expiry_is_milliseconds_relative_to_now(t, m):
    assert t.put("texpms", b"brief", expiry=200) == b"+1"
    assert t.put("texpms2", b"lasting", expiry=60_000) == b"+1"
    assert t.call(b"peek texpms") == b":brief"
    time.sleep(0.3)
    assert t.call(b"get texpms") == b"*"
    assert t.call(b"get texpms2") == b":lasting"
    assert m.stats()["queue_texpms_expired_items"] == "1"


def test_disconnect_returns_the_open_item_to_the_head(text_server, m):
    first = text_client(text_server)
    assert first.put("tdisc", b"A", b"B") == b"+2"
    assert first.call(b"get tdisc") == b":A"
    first.close()
    assert wait_for(lambda: m.stats()["queue_tdisc_open_transactions"] == "0")
    second = text_client(text_server)
    assert second.call(b"get tdisc") == b":A"
    second.close()


def test_a_queue_is_shared_by_both_ports(t, m):
    assert m.set("tshared", b"from-memcache") == b"STORED"
    assert t.call(b"get tshared") == b":from-memcache"
    assert t.put("tshared", b"from-text") == b"+1"  # the open item is still open
    assert m.get("tshared") == b"from-text"
    assert t.call(b"get tshared") == b"*"  # confirms the memcache item
    stats = m.stats()
    assert stats["queue_tshared_items"] == "0"
    assert stats["queue_tshared_open_transactions"] == "0"
    assert stats["queue_tshared_total_items"] == "2"


def test_non_ascii_bytes_are_re_encoded_as_utf8(t, m):
    assert t.put("tutf", b"caf\xe9", b"plain", b"\xff\x80") == b"+3"
    assert m.get("tutf") == b"caf\xc3\xa9"
    assert m.get("tutf") == b"plain"
    assert m.get("tutf") == b"\xc3\xbf\xc2\x80"
    assert m.set("tutf", b"raw\xe9") == b"STORED"
    assert t.call(b"get tutf") == b":raw\xe9"  # items go out as raw bytes


def test_put_without_items_stores_nothing(t, m):
    assert t.call(b"put tnoitems") == b"+0"
    assert t.put("tnoitems") == b"+0"
    assert "queue_tnoitems_items" not in m.stats()


def test_quit_closes_the_connection(t):
    t.send(b"quit\n")
    assert t.is_closed()


def test_put_to_an_alias_reaches_every_destination(t, m):
    assert t.put("talias", b"x", b"y") == b"+2"
    assert t.call(b"get tal1") == b":x"
    assert t.call(b"get tal2") == b":x"
    assert m.get("tal1") == b"y"
    assert m.get("tal2") == b"y"
    stats = m.stats()
    assert stats["queue_talias_put_items"] == "2"
    assert stats["queue_talias_put_bytes"] == "2"


def test_put_to_an_alias_counts_only_items_every_destination_took(t, m):
    assert t.put("talfull", b"filler") == b"+1"
    assert t.put("tpart", b"a", b"b") == b"+0"
    assert m.get("tal3") == b"a"
    assert m.get("tal3") == b"b"
    assert m.stats()["queue_tpart_put_items"] == "2"


def test_reads_from_an_alias_find_nothing(t, m):
    assert t.call(b"get talias") == b"*"
    assert t.call(b"peek talias") == b"*"
    assert t.call(b"monitor talias 100") == b"*"
    assert "queue_talias_items" not in m.stats()


def test_put_to_a_fanout_master_copies_to_its_children(t, m):
    assert t.call(b"get tfan+c") == b"*"
    assert t.put("tfan", b"1", b"2") == b"+2"
    assert m.get("tfan+c") == b"1"
    assert m.get("tfan+c") == b"2"
    assert t.call(b"get tfan") == b":1"


def test_put_to_a_fanout_only_master_stores_nothing(t, m):
    assert t.put("tfanout", b"1", b"2") == b"+2"  # accepted, kept nowhere
    assert t.call(b"get tfanout") == b"*"
    stats = m.stats()
    assert stats["queue_tfanout_total_items"] == "0"
    assert stats["queue_tfanout_items"] == "0"
