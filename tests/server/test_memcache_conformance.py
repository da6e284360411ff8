"""Black-box memcache conformance (behaviour §1, §2, §5.1–5.5, behaviour §10): exact bytes on the wire.

Every test talks to a real ``kestrel-actors serve`` process over a socket. Tests that share
``module_server`` use queue names that no other test uses (``qname``). The helpers they share
with the other ``test_memcache_*`` modules are in ``tests/helpers.py``.

Blocking reads and MONITOR live in ``test_memcache_blocking.py``, malformed input in
``test_memcache_bad_input.py`` and STATS/DUMP_STATS in ``test_memcache_stats.py``. The
byte-exact tests that need no socket run in process: ``tests/session/test_memcache_bytes.py``.
"""

from __future__ import annotations

import re
import time

import pytest

from ..helpers import (
    assert_dropped,
    assert_reply_then_close,
    assert_silent,
    assert_still_open,
    drain_queue,
    expect,
    fill,
    queue_stat,
    set_cmd,
    stats_of,
    unique,
    value,
    wait_queue_stat,
)


def test_set_then_get_exact_bytes(module_server, qname):
    c = module_server.client()
    c.send(b"set %s 0 0 5\r\nhello\r\n" % qname.encode())
    expect(c, b"STORED\r\n")
    c.send(b"get %s\r\n" % qname.encode())
    expect(c, b"VALUE %s 0 5\r\nhello\r\nEND\r\n" % qname.encode())
    c.send(b"get %s\r\n" % qname.encode())
    expect(c, b"END\r\n")
    assert_silent(c, 0.2)


def test_request_split_across_many_tcp_segments(module_server, qname):
    c = module_server.client()
    request = set_cmd(qname, b"abc\r\ndef") + b"get %s\r\n" % qname.encode()
    for i in range(len(request)):
        c.send(request[i : i + 1])
        time.sleep(0.002)
    expect(c, b"STORED\r\n" + value(qname, b"abc\r\ndef"))


# -- pipelining ------------------------------------------------------------------------------


def test_pipelined_commands_answered_in_order(module_server, qname):
    q = qname.encode()
    c = module_server.client()
    c.send(
        set_cmd(qname, b"a") + set_cmd(qname, b"bb") + b"get %s\r\n" % q + b"stats\r\n"
        + b"get %s/peek\r\n" % q + b"get %s\r\n" % q + b"get %s\r\n" % q
        + b"delete %s\r\n" % q + b"version\r\n"
    )
    expect(c, b"STORED\r\nSTORED\r\n" + value(qname, b"a"))
    stats = {}
    while (line := c.read_line()) != b"END":
        _, key, val = line.decode("latin-1").split(" ", 2)
        stats[key] = val
    assert stats[f"queue_{qname}_items"] == "1"
    expect(c, value(qname, b"bb") + value(qname, b"bb") + b"END\r\nDELETED\r\n")
    assert re.fullmatch(rb"VERSION \S+", c.read_line())


# -- behaviour §10.2 GET option grammar ----------------------------------------------------------------


def test_repeated_options_are_harmless(module_server, qname):
    q = qname.encode()
    c = module_server.client()
    fill(c, qname, b"A", b"B")
    c.send(b"get %s/open/open/t=5/t=5\r\n" % q)
    expect(c, value(qname, b"A"))
    assert queue_stat(module_server, qname, "open_transactions") == "1"
    c.send(b"get %s/close/close\r\n" % q)
    expect(c, b"END\r\n")
    c.send(b"get %s/peek/peek\r\n" % q)
    expect(c, value(qname, b"B"))
    assert queue_stat(module_server, qname, "items") == "1"


@pytest.mark.parametrize("suffix", ["/foo", "/OPEN", "/Peek", "//", "/", "/x=1", "/opens"])
def test_unknown_options_are_ignored_and_give_a_plain_get(module_server, qname, suffix):
    c = module_server.client()
    fill(c, qname, b"A", b"B")
    c.send(b"get %s%s\r\n" % (qname.encode(), suffix.encode()))
    expect(c, value(qname, b"A"))
    stats = stats_of(module_server)
    assert stats[f"queue_{qname}_items"] == "1"  # removed, not peeked
    assert stats[f"queue_{qname}_open_transactions"] == "0"  # and not opened
    # no open read: a plain GET is allowed on the same connection
    c.send(b"get %s\r\n" % qname.encode())
    expect(c, value(qname, b"B"))


ILLEGAL_COMBINATIONS = [
    "open/peek", "peek/open", "close/peek", "peek/close", "open/abort", "abort/open",
    "close/abort", "abort/close", "peek/abort", "abort/peek", "open/close/peek",
    "t=10/peek/abort", "close/open/abort",
]


@pytest.mark.parametrize("options", ILLEGAL_COMBINATIONS)
def test_illegal_option_combination_is_client_error_and_close(module_server, qname, options):
    c = module_server.client()
    fill(c, qname, b"A")
    # the pipelined SET after it must never run: the connection is closed first
    c.send(b"get %s/%s\r\n" % (qname.encode(), options.encode()) + set_cmd(qname, b"late"))
    assert_reply_then_close(c, b"CLIENT_ERROR\r\n")
    assert drain_queue(module_server, qname) == [b"A"]  # nothing was fetched


@pytest.mark.parametrize("request_line", [b"get /open", b"get  q", b"get /t=10", b"get /peek", b"gets  q"])
def test_empty_queue_name_is_client_error_and_close(module_server, request_line):
    c = module_server.client()
    c.send(request_line + b"\r\n")
    assert_reply_then_close(c, b"CLIENT_ERROR\r\n")


def test_get_close_on_an_empty_or_missing_queue_is_end(module_server, qname):
    c = module_server.client()
    c.send(b"get %s/close\r\n" % qname.encode())
    expect(c, b"END\r\n")
    assert_still_open(c)


@pytest.mark.parametrize("timeout", ["x", "", "1.5", "10ms", "0x10"])
def test_non_numeric_timeout_drops_the_connection(module_server, qname, timeout):
    c = module_server.client()
    fill(c, qname, b"A")
    c.send(b"get %s/t=%s\r\n" % (qname.encode(), timeout.encode()))
    assert_dropped(c)
    assert drain_queue(module_server, qname) == [b"A"]


# -- behaviour §10.3 / behaviour §10.4 reliable reads --------------------------------------------------------------


def test_open_then_close_confirms_and_stats_move(module_server, qname):
    q = qname.encode()
    c = module_server.client()
    fill(c, qname, b"A", b"B")
    stats = stats_of(module_server)
    assert (stats[f"queue_{qname}_items"], stats[f"queue_{qname}_open_transactions"]) == ("2", "0")
    assert stats[f"queue_{qname}_bytes"] == "2"
    c.send(b"get %s/open\r\n" % q)
    expect(c, value(qname, b"A"))
    stats = stats_of(module_server)
    assert (stats[f"queue_{qname}_items"], stats[f"queue_{qname}_open_transactions"]) == ("1", "1")
    assert stats[f"queue_{qname}_bytes"] == "1"
    c.send(b"get %s/close\r\n" % q)
    expect(c, b"END\r\n")
    stats = stats_of(module_server)
    assert (stats[f"queue_{qname}_items"], stats[f"queue_{qname}_open_transactions"]) == ("1", "0")
    c.close()
    assert drain_queue(module_server, qname) == [b"B"]  # A is gone for good


def test_abort_puts_the_item_back_at_the_head(module_server, qname):
    q = qname.encode()
    c = module_server.client()
    fill(c, qname, b"A", b"B", b"C")
    c.send(b"get %s/open\r\n" % q)
    expect(c, value(qname, b"A"))
    c.send(b"get %s/abort\r\n" % q)
    expect(c, b"END\r\n")
    stats = stats_of(module_server)
    assert (stats[f"queue_{qname}_items"], stats[f"queue_{qname}_open_transactions"]) == ("3", "0")
    assert stats[f"queue_{qname}_canceled_transactions"] == "1"
    c.send(b"get %s\r\nget %s\r\nget %s\r\n" % (q, q, q))
    expect(c, value(qname, b"A") + value(qname, b"B") + value(qname, b"C"))


def test_abort_with_nothing_open_is_end_and_creates_nothing(module_server, qname):
    c = module_server.client()
    c.send(b"get %s/abort\r\nget %s/abort/t=500\r\n" % (qname.encode(), qname.encode()))
    expect(c, b"END\r\nEND\r\n")
    assert not any(k.startswith(f"queue_{qname}_") for k in stats_of(module_server))


def test_abort_does_not_fetch(module_server, qname):
    c = module_server.client()
    fill(c, qname, b"A")
    c.send(b"get %s/abort\r\n" % qname.encode())
    expect(c, b"END\r\n")
    assert queue_stat(module_server, qname, "items") == "1"


def test_disconnect_returns_the_open_item_to_the_head(module_server, qname):
    c = module_server.client()
    fill(c, qname, b"A", b"B")
    c.send(b"get %s/open\r\n" % qname.encode())
    expect(c, value(qname, b"A"))
    c.close()
    wait_queue_stat(module_server, qname, "open_transactions", "0")
    assert queue_stat(module_server, qname, "items") == "2"
    assert drain_queue(module_server, qname) == [b"A", b"B"]


def test_disconnect_with_several_open_returns_them_in_reverse_order(make_server):
    server = make_server("--max-open-transactions", "10")
    c = server.client()
    fill(c, "q", b"A", b"B", b"C", b"D")
    c.send(b"get q/open\r\nget q/open\r\nget q/open\r\n")
    expect(c, value("q", b"A") + value("q", b"B") + value("q", b"C"))
    assert queue_stat(server, "q", "open_transactions") == "3"
    c.close()
    wait_queue_stat(server, "q", "open_transactions", "0")
    assert drain_queue(server, "q") == [b"C", b"B", b"A", b"D"]


def test_a_waiter_reads_the_head_a_whole_disconnect_leaves(make_server):
    # The hang-up's open reads all go back before the waiter reads (behaviour §2.6): it gets
    # the last one opened, not the first one put back.
    server = make_server("--max-open-transactions", "10")
    c = server.client()
    fill(c, "q", b"A", b"B", b"C")
    c.send(b"get q/open\r\nget q/open\r\nget q/open\r\n")
    expect(c, value("q", b"A") + value("q", b"B") + value("q", b"C"))
    waiter = server.client()
    waiter.send(b"get q/t=30000\r\n")
    wait_queue_stat(server, "q", "waiters", "1")
    c.close()
    expect(waiter, value("q", b"C"))
    wait_queue_stat(server, "q", "open_transactions", "0")
    assert drain_queue(server, "q") == [b"B", b"A"]


def test_disconnect_returns_open_items_on_every_queue(make_server):
    server = make_server("--max-open-transactions", "10")
    c = server.client()
    fill(c, "one", b"1a", b"1b")
    fill(c, "two", b"2a")
    c.send(b"get one/open\r\nget two/open\r\nget one/open\r\n")
    expect(c, value("one", b"1a") + value("two", b"2a") + value("one", b"1b"))
    c.close()
    wait_queue_stat(server, "one", "open_transactions", "0")
    wait_queue_stat(server, "two", "open_transactions", "0")
    assert drain_queue(server, "one") == [b"1b", b"1a"]
    assert drain_queue(server, "two") == [b"2a"]


def test_close_open_confirms_and_opens_the_next_in_one_step(module_server, qname):
    q = qname.encode()
    c = module_server.client()
    fill(c, qname, b"A", b"B")
    c.send(b"get %s/close/open\r\n" % q)  # nothing to confirm yet: just opens A
    expect(c, value(qname, b"A"))
    c.send(b"get %s/close/open\r\n" % q)
    expect(c, value(qname, b"B"))
    stats = stats_of(module_server)
    assert (stats[f"queue_{qname}_items"], stats[f"queue_{qname}_open_transactions"]) == ("0", "1")
    c.send(b"get %s/close/open\r\n" % q)  # confirms B, queue empty
    expect(c, b"END\r\n")
    assert queue_stat(module_server, qname, "open_transactions") == "0"
    c.close()
    time.sleep(0.1)
    assert drain_queue(module_server, qname) == []


def test_open_several_reads_close_and_abort_act_on_the_oldest(make_server):
    # behaviour §2.5 "open several reads" (limit 10)
    server = make_server("--max-open-transactions", "10")
    c = server.client()
    fill(c, "q", b"A", b"B", b"C", b"D")
    c.send(b"get q/open\r\nget q/open\r\n")
    expect(c, value("q", b"A") + value("q", b"B"))
    c.send(b"get q/abort\r\n")  # oldest open (A) goes back to the head
    expect(c, b"END\r\n")
    c.send(b"get q/open\r\n")
    expect(c, value("q", b"A"))
    c.send(b"get q/close\r\n")  # confirms the oldest open: B
    expect(c, b"END\r\n")
    assert queue_stat(server, "q", "open_transactions") == "1"
    c.send(b"get q/close/open\r\n")  # confirms A, opens C
    expect(c, value("q", b"C"))
    c.close()
    wait_queue_stat(server, "q", "open_transactions", "0")
    assert drain_queue(server, "q") == [b"C", b"D"]


def test_second_open_over_the_default_limit_is_error_and_close(server):
    c = server.client()
    fill(c, "jobs", b"hello", b"world")
    c.send(b"get jobs/open\r\n")
    expect(c, value("jobs", b"hello"))
    c.send(b"get jobs/open\r\n" + set_cmd("jobs", b"never"))
    assert_reply_then_close(c, b"ERROR\r\n")
    wait_queue_stat(server, "jobs", "open_transactions", "0")
    assert drain_queue(server, "jobs") == [b"hello", b"world"]


def test_open_miss_leaves_nothing_open(module_server, qname):
    q = qname.encode()
    c = module_server.client()
    c.send(b"get %s/open\r\nget %s/open\r\n" % (q, q))  # two misses: no ERROR, nothing pending
    expect(c, b"END\r\nEND\r\n")
    fill(c, qname, b"A", b"B")
    c.send(b"get %s\r\nconfirm %s 1\r\n" % (q, q))  # a plain GET is allowed; nothing to confirm
    expect(c, value(qname, b"A") + b"ERROR\r\n")
    assert queue_stat(module_server, qname, "open_transactions") == "0"


def test_confirm_abort_and_disconnect_after_delete_do_not_recreate(make_server):
    server = make_server("--max-open-transactions", "10")
    holder, admin = server.client(), server.client()
    fill(holder, "q", b"A", b"B", b"C")
    holder.send(b"get q/open\r\nget q/open\r\nget q/open\r\n")
    expect(holder, value("q", b"A") + value("q", b"B") + value("q", b"C"))
    admin.send(b"delete q\r\n")
    expect(admin, b"DELETED\r\n")
    holder.send(b"confirm q 1\r\nget q/abort\r\n")
    expect(holder, b"END\r\nEND\r\n")
    assert not any(k.startswith("queue_q_") for k in stats_of(server))
    holder.close()
    time.sleep(0.2)
    assert not any(k.startswith("queue_q_") for k in stats_of(server))


def test_open_limit_is_per_queue(server):
    c = server.client()
    fill(c, "one", b"1")
    fill(c, "two", b"2")
    c.send(b"get one/open\r\nget two/open\r\n")
    expect(c, value("one", b"1") + value("two", b"2"))
    assert_still_open(c)


def test_open_limit_counts_per_connection(server):
    a, b = server.client(), server.client()
    fill(a, "q", b"1", b"2")
    a.send(b"get q/open\r\n")
    expect(a, value("q", b"1"))
    b.send(b"get q/open\r\n")
    expect(b, value("q", b"2"))
    assert queue_stat(server, "q", "open_transactions") == "2"


def test_open_limit_from_cli_option(make_server):
    server = make_server("--max-open-transactions", "3")
    c = server.client()
    fill(c, "q", b"1", b"2", b"3", b"4")
    c.send(b"get q/open\r\n" * 3)
    expect(c, value("q", b"1") + value("q", b"2") + value("q", b"3"))
    c.send(b"get q/open\r\n")
    assert_reply_then_close(c, b"ERROR\r\n")
    wait_queue_stat(server, "q", "open_transactions", "0")
    assert drain_queue(server, "q") == [b"3", b"2", b"1", b"4"]


def test_plain_get_while_open_is_error_and_close(server):
    c = server.client()
    fill(c, "q", b"A", b"B")
    c.send(b"get q/open\r\n")
    expect(c, value("q", b"A"))
    c.send(b"get q\r\n")
    assert_reply_then_close(c, b"ERROR\r\n")
    wait_queue_stat(server, "q", "open_transactions", "0")
    assert drain_queue(server, "q") == [b"A", b"B"]


def test_peek_while_open_is_allowed(server):
    c = server.client()
    fill(c, "q", b"A", b"B")
    c.send(b"get q/open\r\nget q/peek\r\n")
    expect(c, value("q", b"A") + value("q", b"B"))
    assert_still_open(c)


def test_plain_get_on_another_queue_while_open_is_allowed(server):
    c = server.client()
    fill(c, "q", b"A")
    fill(c, "r", b"R")
    c.send(b"get q/open\r\nget r\r\n")
    expect(c, value("q", b"A") + value("r", b"R"))
    assert_still_open(c)


def test_confirm_more_than_open_is_error_and_confirms_nothing(make_server):
    server = make_server("--max-open-transactions", "10")
    c = server.client()
    fill(c, "q", b"A", b"B", b"C")
    c.send(b"get q/open\r\nget q/open\r\n")
    expect(c, value("q", b"A") + value("q", b"B"))
    c.send(b"confirm q 3\r\n")
    expect(c, b"ERROR\r\n")
    assert_still_open(c)
    assert queue_stat(server, "q", "open_transactions") == "2"
    c.send(b"confirm q 1\r\n")  # the oldest: A
    expect(c, b"END\r\n")
    assert queue_stat(server, "q", "open_transactions") == "1"
    c.close()
    wait_queue_stat(server, "q", "open_transactions", "0")
    assert drain_queue(server, "q") == [b"B", b"C"]


def test_confirm_with_the_default_limit(server):
    c = server.client()
    fill(c, "q", b"A", b"B")
    c.send(b"get q/open\r\nconfirm q 2\r\n")
    expect(c, value("q", b"A") + b"ERROR\r\n")
    c.send(b"confirm q 0\r\n")
    expect(c, b"ERROR\r\n")
    assert queue_stat(server, "q", "open_transactions") == "1"
    c.send(b"confirm q 1\r\n")
    expect(c, b"END\r\n")
    c.send(b"confirm q 1\r\n")  # nothing open any more
    expect(c, b"ERROR\r\n")
    stats = stats_of(server)
    assert (stats["queue_q_items"], stats["queue_q_open_transactions"]) == ("1", "0")
    c.close()
    assert drain_queue(server, "q") == [b"B"]


def test_confirm_zero_with_nothing_open_is_error(module_server, qname):
    c = module_server.client()
    fill(c, qname, b"A")
    c.send(b"confirm %s 0\r\n" % qname.encode())
    expect(c, b"ERROR\r\n")
    assert_still_open(c)


def test_confirm_only_acts_on_this_connections_reads(server):
    a, b = server.client(), server.client()
    fill(a, "q", b"A")
    a.send(b"get q/open\r\n")
    expect(a, value("q", b"A"))
    b.send(b"confirm q 1\r\n")
    expect(b, b"ERROR\r\n")
    assert queue_stat(server, "q", "open_transactions") == "1"


def test_confirm_missing_count_is_client_error_and_stays_open(module_server, qname):
    c = module_server.client()
    c.send(b"confirm %s\r\n" % qname.encode())
    expect(c, b"CLIENT_ERROR\r\n")
    assert_still_open(c)


def test_confirm_non_numeric_count_drops(module_server, qname):
    c = module_server.client()
    c.send(b"confirm %s x\r\n" % qname.encode())
    assert_dropped(c)


# -- behaviour §10.8 queue management replies, unknown commands, noreply ---------------------------------


def test_delete_replies_deleted_and_removes_the_queue(module_server, qname):
    c = module_server.client()
    fill(c, qname, b"A")
    c.send(b"delete %s\r\n" % qname.encode())
    expect(c, b"DELETED\r\n")
    assert not any(k.startswith(f"queue_{qname}_") for k in stats_of(module_server))
    c.send(b"get %s\r\n" % qname.encode())  # a later GET re-creates it empty
    expect(c, b"END\r\n")
    assert queue_stat(module_server, qname, "items") == "0"


def test_delete_of_a_missing_queue_replies_deleted(module_server, qname):
    c = module_server.client()
    c.send(b"delete %s\r\n" % qname.encode())
    expect(c, b"DELETED\r\n")
    assert not any(k.startswith(f"queue_{qname}_") for k in stats_of(module_server))


def test_flush_replies_end_and_empties_the_queue(module_server, qname):
    c = module_server.client()
    fill(c, qname, b"A", b"B")
    c.send(b"flush %s\r\n" % qname.encode())
    expect(c, b"END\r\n")
    stats = stats_of(module_server)
    assert (stats[f"queue_{qname}_items"], stats[f"queue_{qname}_bytes"]) == ("0", "0")
    assert stats[f"queue_{qname}_total_flushes"] == "1"
    c.send(b"get %s\r\n" % qname.encode())
    expect(c, b"END\r\n")


def test_flush_does_not_touch_open_transactions(server):
    c = server.client()
    fill(c, "q", b"A", b"B")
    c.send(b"get q/open\r\nflush q\r\n")
    expect(c, value("q", b"A") + b"END\r\n")
    assert queue_stat(server, "q", "open_transactions") == "1"
    c.send(b"get q/abort\r\nget q\r\n")
    expect(c, b"END\r\n" + value("q", b"A"))


def test_flush_all_empties_every_queue(server):
    c = server.client()
    fill(c, "one", b"1", b"1")
    fill(c, "two", b"2")
    c.send(b"flush_all\r\n")
    expect(c, b"Flushed all queues.\r\n")
    stats = stats_of(server)
    assert stats["curr_items"] == "0"
    assert (stats["queue_one_items"], stats["queue_two_items"]) == ("0", "0")


def test_flush_all_with_no_queues(server):
    c = server.client()
    c.send(b"flush_all\r\n")
    expect(c, b"Flushed all queues.\r\n")


def test_version_reply(module_server):
    """Kestrel's release (x.y.z with a non-zero major, as libmemcached's tools and node's
    memcached client require), the same in STATS."""
    c = module_server.client()
    c.send(b"version\r\n")
    line = c.read_line()
    assert line == b"VERSION 2.4.7"
    assert re.fullmatch(rb"VERSION [1-9][0-9]*\.[0-9]+\.[0-9]+", line)
    assert line[len(b"VERSION "):].decode() == stats_of(module_server)["version"]


@pytest.mark.parametrize(
    "request_line",
    [b"delete", b"flush", b"monitor", b"confirm"],
)
def test_missing_argument_is_client_error_and_stays_open(module_server, request_line):
    c = module_server.client()
    c.send(request_line + b"\r\n")
    expect(c, b"CLIENT_ERROR\r\n")
    assert_still_open(c)


@pytest.mark.parametrize(
    "request_line",
    [
        b"incr q 1",
        b"decr q 1",
        b"touch q 10",
        b"verbosity 1",
        b"",
        b" get q",
        b"get\tq",
        b"bogus",
        b"VALUE q 0 1",
    ],
)
def test_unknown_command_is_client_error_and_close(module_server, request_line):
    c = module_server.client()
    c.send(request_line + b"\r\n" + b"version\r\n")
    assert_reply_then_close(c, b"CLIENT_ERROR\r\n")


@pytest.mark.parametrize(
    "storage_line",
    [b"add %s 0 0 5", b"replace %s 0 0 5", b"append %s 0 0 5", b"prepend %s 0 0 5", b"cas %s 0 0 5 99"],
)
def test_unsupported_storage_command_consumes_data_then_client_error_and_close(module_server, qname, storage_line):
    c = module_server.client()
    c.send(storage_line % qname.encode() + b"\r\n")
    assert_silent(c, 0.3)  # waiting for the data block first
    c.send(b"hello\r\n")
    assert_reply_then_close(c, b"CLIENT_ERROR\r\n")
    assert not any(k.startswith(f"queue_{qname}_") for k in stats_of(module_server))


def test_unsupported_storage_command_with_data_that_looks_like_commands(module_server, qname):
    c = module_server.client()
    inner = b"get %s\r\n" % qname.encode()
    c.send(b"add %s 0 0 %d\r\n%s\r\n" % (qname.encode(), len(inner), inner))
    assert_reply_then_close(c, b"CLIENT_ERROR\r\n")  # one reply: the data was not parsed


def test_noreply_is_ignored_and_replies_are_sent(module_server, qname):
    q = qname.encode()
    c = module_server.client()
    c.send(b"set %s 0 0 5 noreply\r\nhello\r\n" % q)
    expect(c, b"STORED\r\n")
    c.send(b"get %s noreply\r\n" % q)
    expect(c, value(qname, b"hello"))
    c.send(b"flush %s noreply\r\n" % q)
    expect(c, b"END\r\n")
    c.send(b"delete %s noreply\r\n" % q)
    expect(c, b"DELETED\r\n")


def test_quit_closes_without_reply(module_server):
    c = module_server.client()
    c.send(b"quit\r\n")
    assert_dropped(c)


# -- behaviour §10.9 queue creation and names -------------------------------------------------------------


def _queue_keys(server, name):
    return [k for k in stats_of(server) if k.startswith(f"queue_{name}_")]


def test_get_creates_the_queue(module_server, qname):
    assert _queue_keys(module_server, qname) == []
    c = module_server.client()
    c.send(b"get %s\r\n" % qname.encode())
    expect(c, b"END\r\n")
    assert queue_stat(module_server, qname, "items") == "0"


@pytest.mark.parametrize("options", ["/peek", "/open", "/t=1"])
def test_get_with_options_creates_the_queue(module_server, qname, options):
    c = module_server.client()
    c.send(b"get %s%s\r\n" % (qname.encode(), options.encode()))
    expect(c, b"END\r\n")
    assert queue_stat(module_server, qname, "items") == "0"


def test_set_creates_the_queue(module_server, qname):
    c = module_server.client()
    fill(c, qname, b"x")
    assert queue_stat(module_server, qname, "items") == "1"


@pytest.mark.parametrize(
    "request_line",
    [b"flush %s", b"delete %s", b"confirm %s 1", b"get %s/close", b"get %s/abort", b"stats %s", b"dump_stats %s"],
)
def test_commands_that_do_not_create_the_queue(module_server, qname, request_line):
    c = module_server.client()
    c.send(request_line % qname.encode() + b"\r\nversion\r\n")
    lines = []
    while not (line := c.read_line()).startswith(b"VERSION "):
        lines.append(line)
    assert lines and lines[0] not in (b"CLIENT_ERROR", b"SERVER_ERROR"), lines
    assert _queue_keys(module_server, qname) == []


ILLEGAL_NAMES = {
    "dot": b"a.b",
    "tilde": b"a~b",
    "nul": b"a\x00b",
    "long": b"n" * 1000,
    "dotdot": b"..",
}


@pytest.mark.parametrize("name", list(ILLEGAL_NAMES))
@pytest.mark.parametrize("verb", ["get", "set", "peek"])
def test_illegal_queue_name_drops_and_server_keeps_serving(module_server, verb, name):
    bad = ILLEGAL_NAMES[name]
    canary = unique("canary")
    setup = module_server.client()
    fill(setup, canary, b"one", b"two")
    c = module_server.client()
    if verb == "set":
        c.send(b"set %s 0 0 3\r\nabc\r\n" % bad)
    elif verb == "get":
        c.send(b"get %s\r\n" % bad)
    else:
        c.send(b"get %s/peek\r\n" % bad)
    assert_dropped(c)
    stats = stats_of(module_server)
    assert not any(bad.decode("latin-1") in k for k in stats)
    assert stats[f"queue_{canary}_items"] == "2"
    assert drain_queue(module_server, canary) == [b"one", b"two"]


@pytest.mark.parametrize("bad", [b"a/b", b"/x", b"a/"])
def test_slash_in_a_set_name_drops(module_server, bad):
    c = module_server.client()
    c.send(b"set %s 0 0 3\r\nabc\r\n" % bad)
    assert_dropped(c)


def test_illegal_name_drop_ignores_pipelined_commands(module_server, qname):
    c = module_server.client()
    c.send(b"get a.b\r\n" + set_cmd(qname, b"late") + b"version\r\n")
    assert_dropped(c)
    assert not any(k.startswith(f"queue_{qname}_") for k in stats_of(module_server))


def test_empty_name_on_set_drops(module_server):
    c = module_server.client()
    c.send(b"set  0 0 3\r\nabc\r\n")
    assert_dropped(c)
    assert_still_open(module_server.client())


def test_plus_is_a_legal_name_character(module_server):
    name = unique("plus") + "+child"
    c = module_server.client()
    fill(c, name, b"x")
    c.send(b"get %s\r\n" % name.encode())
    expect(c, value(name, b"x"))


# -- a real client library: pymemcache -----------------------------------------------------------


def pymemcache_clients():
    """pymemcache's plain ``Client``, and a subclass for Kestrel's reliable reads.

    pymemcache keys each reply by the ``VALUE`` key, but Kestrel answers ``get q/open`` with the
    bare ``VALUE q`` (behaviour §2.5), so the plain client raises ``KeyError`` there. The subclass
    maps the bare name back to the key asked for (``_extract_value`` is pymemcache's documented
    override point)."""
    base = pytest.importorskip("pymemcache.client.base")

    class KestrelPymemcache(base.Client):
        def _extract_value(self, expect_cas, line, buf, remapped_keys, prefixed_keys):
            remapped = dict(remapped_keys)
            for key in prefixed_keys:
                remapped.setdefault(key.split(b"/")[0], remapped_keys[key])
            return super()._extract_value(expect_cas, line, buf, remapped, prefixed_keys)

    return base.Client, KestrelPymemcache


def test_pymemcache_round_trip(module_server, qname):
    plain, _ = pymemcache_clients()
    client = plain((module_server.host, module_server.port), default_noreply=False, timeout=5)
    try:
        assert client.set(qname, b"hello") is True
        assert client.set(qname, b"world", noreply=False) is True
        assert client.get(qname) == b"hello"
        assert client.get(qname) == b"world"
        assert client.get(qname) is None
        assert client.version() == stats_of(module_server)["version"].encode()
    finally:
        client.close()


def test_pymemcache_reliable_read(module_server, qname):
    _, kestrel = pymemcache_clients()
    client = kestrel((module_server.host, module_server.port), default_noreply=False, timeout=5)
    try:
        assert client.set(qname, b"first") is True
        assert client.set(qname, b"second") is True
        assert client.get(f"{qname}/open") == b"first"
        stats = stats_of(module_server)
        assert (stats[f"queue_{qname}_items"], stats[f"queue_{qname}_open_transactions"]) == ("1", "1")
        assert client.get(f"{qname}/close") is None
        assert queue_stat(module_server, qname, "open_transactions") == "0"
        assert client.get(f"{qname}/close/open") == b"second"
        assert client.get(f"{qname}/close/open") is None
        assert client.get(qname) is None
    finally:
        client.close()
    assert drain_queue(module_server, qname) == []
