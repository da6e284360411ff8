"""Malformed input (behaviour §2.1, §2.2, §2.4, §10): the exact reaction on the offending
connection, and afterwards the server still serves the next client with earlier items intact."""

from __future__ import annotations

import random
import re
import time
from pathlib import Path

import pytest

from ..helpers import (
    PATIENCE,
    assert_dropped,
    assert_reply_then_close,
    assert_silent,
    assert_still_open,
    drain,
    drain_queue,
    expect,
    fill,
    send_quietly,
    stats_of,
    unique,
    value,
    wait_for,
)


@pytest.fixture
def canary(module_server):
    """A queue holding two items before the bad input; checked intact afterwards."""
    name = unique("canary")
    fill(module_server.client(), name, b"first", b"second")
    yield name
    stats = stats_of(module_server)
    assert stats[f"queue_{name}_items"] == "2"
    assert drain_queue(module_server, name) == [b"first", b"second"]


@pytest.fixture
def qname() -> str:
    return unique("bad")


def rss_kib(server) -> int:
    status = Path(f"/proc/{server.proc.pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1))


def assert_not_created(server, queue):
    assert not any(k.startswith(f"queue_{queue}_") for k in stats_of(server))


# -- malformed storage lines ------------------------------------------------------------------


@pytest.mark.parametrize(
    "line", [b"set", b"set %s", b"set %s 0", b"set %s 0 0", b"set %s\t0 0 5", b"add %s 0 0", b"cas %s"]
)
def test_storage_line_with_fewer_than_five_tokens_closes_without_reply(module_server, canary, qname, line):
    c = module_server.client()
    c.send((line % qname.encode() if b"%s" in line else line) + b"\r\nhello\r\n")
    assert_dropped(c)
    assert_not_created(module_server, qname)


@pytest.mark.parametrize("count", [b"abc", b"5x", b"", b"0x10", b"99999999999", b"2147483648", b"1.5"])
def test_non_numeric_or_out_of_range_byte_count_closes(module_server, canary, qname, count):
    c = module_server.client()
    c.send(b"set %s 0 0 %s\r\nhello\r\n" % (qname.encode(), count))
    data, closed = drain(c, PATIENCE)
    assert closed
    assert data in (b"", b"CLIENT_ERROR\r\n")
    assert_not_created(module_server, qname)


@pytest.mark.parametrize("count", [b"-1", b"-5", b"-2147483648"])
def test_negative_byte_count_closes(module_server, canary, qname, count):
    c = module_server.client()
    c.send(b"set %s 0 0 %s\r\nhello\r\n" % (qname.encode(), count))
    data, closed = drain(c, PATIENCE)
    assert closed
    assert data in (b"", b"CLIENT_ERROR\r\n")
    assert_not_created(module_server, qname)


@pytest.mark.parametrize("exptime", [b"abc", b"1.5", b"10s", b"99999999999999999999"])
def test_non_numeric_exptime_drops_without_reply(module_server, canary, qname, exptime):
    c = module_server.client()
    c.send(b"set %s 0 %s 5\r\nhello\r\n" % (qname.encode(), exptime))
    assert_dropped(c)
    assert drain_queue(module_server, qname) == []


def test_exptime_is_parsed_before_flags(module_server, canary, qname):
    c = module_server.client()
    c.send(b"set %s abc xyz 5\r\nhello\r\n" % qname.encode())
    assert_dropped(c)


@pytest.mark.parametrize("flags", [b"abc", b"2147483648", b"-2147483649", b"4294967295", b"1.0"])
def test_bad_flags_is_client_error_stays_open_and_consumes_the_data(module_server, canary, qname, flags):
    c = module_server.client()
    q = qname.encode()
    c.send(b"set %s %s 0 5\r\nhello\r\nset %s 0 0 2\r\nok\r\nget %s\r\n" % (q, flags, q, q))
    expect(c, b"CLIENT_ERROR\r\nSTORED\r\n" + value(qname, b"ok"))
    assert_still_open(c)


def test_bad_flags_reply_waits_for_the_data_block(module_server, canary, qname):
    c = module_server.client()
    c.send(b"set %s abc 0 5\r\n" % qname.encode())
    assert_silent(c, 0.3)
    c.send(b"hello\r\n")
    expect(c, b"CLIENT_ERROR\r\n")
    assert_still_open(c)


def test_short_data_block_just_waits(module_server, canary, qname):
    c = module_server.client()
    c.send(b"set %s 0 0 10\r\nhello\r\n" % qname.encode())
    assert_silent(c, 0.4)
    c.close()
    time.sleep(0.1)
    assert drain_queue(module_server, qname) == []


def test_short_data_block_completed_later_is_stored_with_the_crlf_inside(module_server, canary, qname):
    c = module_server.client()
    c.send(b"set %s 0 0 10\r\nhello\r\n" % qname.encode())
    assert_silent(c, 0.3)
    c.send(b"abc")
    assert_silent(c, 0.2)
    c.send(b"\r\n")
    expect(c, b"STORED\r\n")
    c.send(b"get %s\r\n" % qname.encode())
    expect(c, value(qname, b"hello\r\nabc"))


def test_data_block_terminator_is_not_checked(module_server, canary, qname):
    c = module_server.client()
    c.send(b"set %s 0 0 5\r\nhello!!get %s\r\n" % (qname.encode(), qname.encode()))
    expect(c, b"STORED\r\n" + value(qname, b"hello"))


def test_longer_data_block_spills_into_the_next_command(module_server, canary, qname):
    c = module_server.client()
    # 3 bytes declared: data "hel", "lo" skipped unchecked, then "\r\n" is an empty command line
    c.send(b"set %s 0 0 3\r\nhello\r\n" % qname.encode())
    assert_reply_then_close(c, b"STORED\r\nCLIENT_ERROR\r\n")
    assert drain_queue(module_server, qname) == [b"hel"]


def test_longer_data_block_with_garbage_tail_is_client_error_and_close(module_server, canary, qname):
    c = module_server.client()
    c.send(b"set %s 0 0 2\r\nhello world\r\n" % qname.encode())
    assert_reply_then_close(c, b"STORED\r\nCLIENT_ERROR\r\n")
    assert drain_queue(module_server, qname) == [b"he"]


@pytest.mark.parametrize("count", [2_000_000_000, 2147483647, 67108865])
def test_huge_declared_length_is_client_error_and_close_without_allocating(module_server, canary, qname, count):
    before = rss_kib(module_server)
    c = module_server.client()
    c.send(b"set %s 0 0 %d\r\n" % (qname.encode(), count))  # no data: the line alone decides
    assert_reply_then_close(c, b"CLIENT_ERROR\r\n")
    after = rss_kib(module_server)
    assert after < before + 32 * 1024, (before, after)
    assert after < 512 * 1024
    assert_not_created(module_server, qname)


def test_declared_length_at_the_default_limit_is_accepted(module_server, canary, qname):
    c = module_server.client()
    c.send(b"set %s 0 0 67108864\r\n" % qname.encode())
    assert_silent(c, 0.3)  # waiting for the 64 MiB block, not refused
    c.close()


def test_max_item_bytes_option_bounds_the_declared_length(make_server):
    server = make_server("--max-item-bytes", "16")
    c = server.client()
    fill(c, "q", b"x" * 16)
    big = server.client()
    big.send(b"set q 0 0 17\r\n")
    assert_reply_then_close(big, b"CLIENT_ERROR\r\n")
    assert drain_queue(server, "q") == [b"x" * 16]


def test_request_line_over_64_kib_without_newline_is_client_error_and_close(module_server, canary):
    c = module_server.client()
    send_quietly(c, b"get " + b"a" * (100 * 1024))
    assert_reply_then_close(c, b"CLIENT_ERROR\r\n")


def test_long_request_line_under_64_kib_is_served(module_server, canary):
    c = module_server.client()
    c.send(b"version" + b" x" * 30_000 + b"\r\n")
    assert re.fullmatch(rb"VERSION \S+", c.read_line())


# -- garbage ----------------------------------------------------------------------------------


GARBAGE = {
    "nul-line": b"\x00\x00\x00\r\n",
    "high-bytes": b"\xff\xfe\xfd\xfc\r\n",
    "blank-lines": b"\r\n\r\n\r\n",
    "lone-cr": b"\r\r\r\r",
    "server-reply": b"VALUE q 0 5\r\nhello\r\nEND\r\n",
    "http": b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",
    "no-newline": bytes(range(1, 10)) * 100,
    "tls-hello": bytes.fromhex("16030100a5010000a10303") + b"\x00" * 64,
}


@pytest.mark.parametrize("name", list(GARBAGE))
def test_garbage_never_hurts_the_server(module_server, canary, name):
    c = module_server.client()
    send_quietly(c, GARBAGE[name])
    data, _closed = drain(c, 0.5)
    assert data in (b"", b"CLIENT_ERROR\r\n", b"END\r\n"), data  # whatever happens: no item, no crash
    c.close()


@pytest.mark.parametrize("seed", range(8))
def test_random_bytes_never_hurt_the_server(module_server, canary, seed):
    rng = random.Random(seed)
    payload = bytes(rng.randrange(256) for _ in range(4096))
    c = module_server.client()
    send_quietly(c, payload)
    drain(c, 0.3)
    c.close()


def test_unknown_command_line_reply_is_exact(module_server, canary):
    c = module_server.client()
    c.send(b"\x00\x01garbage\r\n")
    assert_reply_then_close(c, b"CLIENT_ERROR\r\n")


def test_many_bad_clients_in_a_row(module_server, canary):
    for line in [b"bogus\r\n", b"get a.b\r\n", b"set x\r\n", b"get q/t=x\r\n", b"get /open\r\n"] * 4:
        c = module_server.client()
        c.send(line)
        assert drain(c, PATIENCE)[1]
    assert_still_open(module_server.client())


def test_dropped_and_closed_connections_are_not_leaked(server):
    bad_lines = [b"bogus\r\n", b"get a.b\r\n", b"set x\r\n", b"get q/t=x\r\n", b"get /open\r\n",
                 b"set q 0 0 -1\r\n", b"set q 0 0 2000000000\r\n", b"quit\r\n"]
    for line in bad_lines * 3:
        c = server.client()
        c.send(line)
        assert drain(c, PATIENCE)[1], line
    probe = server.client()
    assert wait_for(lambda: probe.stats()["curr_connections"] == "1")


def test_client_hang_up_mid_data_block_is_harmless(server):
    c = server.client()
    fill(c, "q", b"kept")
    half = server.client()
    half.send(b"set q 0 0 100\r\n" + b"x" * 50)
    time.sleep(0.1)
    half.close()
    assert wait_for(lambda: c.stats()["curr_connections"] == "1")
    assert drain_queue(server, "q") == [b"kept"]


# -- a client that sends and never reads ----------------------------------------------------------


def test_pipelined_reads_never_read_back_neither_stall_others_nor_grow_the_server(module_server, qname):
    """Replies the client does not take stay bounded (reading pauses), another client is
    answered meanwhile, and all of them arrive once it reads."""
    import socket

    item = bytes(range(256)) * 512  # 128 KiB
    fill(module_server.client(), qname, item)
    before = rss_kib(module_server)
    count = 3000  # 384 MiB of replies if the server buffered them all
    greedy = socket.create_connection(("127.0.0.1", module_server.port))
    greedy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    greedy.sendall(b"get %s/peek\r\n" % qname.encode() * count)
    time.sleep(1.0)
    other = module_server.client()
    other_queue = unique("other")
    # answered while the greedy client's replies wait unsent (it reads nothing until below)
    assert other.set(other_queue, b"x") == b"STORED"
    assert other.get(other_queue) == b"x"
    assert rss_kib(module_server) < before + 100 * 1024
    reply = b"VALUE %s 0 %d\r\n%s\r\nEND\r\n" % (qname.encode(), len(item), item)
    expected = len(reply) * count
    received = 0
    greedy.settimeout(10)
    head = b""
    while received < expected:
        chunk = greedy.recv(1 << 20)
        assert chunk, f"closed after {received} of {expected} bytes"
        if len(head) < len(reply):
            head += chunk[: len(reply) - len(head)]
        received += len(chunk)
    assert received == expected and head == reply
    greedy.close()
    assert drain_queue(module_server, qname) == [item]


def test_a_monitor_whose_client_does_not_read_stops_opening_items(module_server, qname):
    """A monitor stream pauses while its replies pile up unsent: items stay in the queue
    instead of being opened and copied into an output buffer without bound."""
    import socket

    item = b"m" * 65536
    count = 1500  # 96 MiB
    greedy = socket.create_connection(("127.0.0.1", module_server.port))
    greedy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    greedy.sendall(b"monitor %s 30 %d\r\n" % (qname.encode(), count))
    time.sleep(0.3)  # the monitor waits on the empty queue
    before = rss_kib(module_server)
    producer = module_server.client()
    for _ in range(0, count, 100):  # items arrive while the monitor runs
        fill(producer, qname, *([item] * 100))
    time.sleep(0.5)
    grown = rss_kib(module_server) - before
    # the items themselves take ~96 MiB; their replies, had they all been opened and sent
    # into a buffer, another ~96 MiB
    assert grown < 150 * 1024, grown
    opened = int(stats_of(module_server)[f"queue_{qname}_open_transactions"])
    assert opened < count // 2, opened
    greedy.close()  # hang up: every open read goes back
    assert wait_for(lambda: stats_of(module_server)[f"queue_{qname}_items"] == str(count))
    assert drain_queue(module_server, qname) == [item] * count
