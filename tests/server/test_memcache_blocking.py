"""Blocking reads (behaviour §1, §5.4, §10.5) and MONITOR/CONFIRM (behaviour §2.7, §10.14), black-box."""

from __future__ import annotations

import select
import time

import pytest

from ..helpers import (
    LONG_WAIT_MS,
    PATIENCE,
    ServerProcess,
    assert_dropped,
    assert_still_open,
    drain_queue,
    expect,
    fill,
    queue_stat,
    stats_of,
    unique,
    value,
    wait_for,
    wait_queue_stat,
)

LONG = b"%d" % LONG_WAIT_MS
"""The ``/t=`` of a read that must end for another reason than its deadline: far beyond the
clients' patience, so a read that waited for it fails the test."""


@pytest.fixture
def qname() -> str:
    return unique("w")


@pytest.fixture(scope="module")
def wide_server(tmp_path_factory):
    """A shared server allowing 10 open reads per connection and queue (for MONITOR streams)."""
    server = ServerProcess(tmp_path_factory.mktemp("wide") / "data", ("--max-open-transactions", "10")).start()
    yield server
    server.stop()


def wait_waiters(server, queue, n, timeout=PATIENCE):
    wait_queue_stat(server, queue, "waiters", str(n), timeout)


def readable(clients, timeout):
    """The clients whose socket has data (or EOF) within ``timeout`` s."""
    socks = {c.sock: c for c in clients if not c.buffer}
    ready = [c for c in clients if c.buffer]
    if ready:
        return ready
    r, _, _ = select.select(list(socks), [], [], timeout)
    return [socks[s] for s in r]


# -- behaviour §10.5 blocking reads ---------------------------------------------------------------------


def test_blocking_get_returns_as_soon_as_another_client_sets(module_server, qname):
    """The set wakes the waiter: it answers long before its minute-long deadline."""
    reader, writer = module_server.client(), module_server.client()
    reader.send(b"get %s/t=%s\r\n" % (qname.encode(), LONG))
    wait_waiters(module_server, qname, 1)
    fill(writer, qname, b"wake")
    expect(reader, value(qname, b"wake"))
    assert queue_stat(module_server, qname, "waiters") == "0"
    assert queue_stat(module_server, qname, "items") == "0"


def test_blocking_get_with_an_item_present_returns_at_once(module_server, qname):
    """An item already there answers the read long before its minute-long deadline."""
    c = module_server.client()
    fill(c, qname, b"ready")
    c.send(b"get %s/t=%s\r\n" % (qname.encode(), LONG))
    expect(c, value(qname, b"ready"))


def test_blocking_get_times_out_with_end_after_about_one_second(module_server, qname):
    """``/t=1000`` ends with END no sooner than a second after the request was sent (load only
    makes it later), and within the clients' patience (milliseconds, not seconds)."""
    c = module_server.client()
    start = time.monotonic()
    c.send(b"get %s/t=1000\r\n" % qname.encode())
    expect(c, b"END\r\n")
    assert time.monotonic() - start >= 0.95
    assert queue_stat(module_server, qname, "waiters") == "0"
    assert_still_open(c)


def test_waits_end_at_their_own_deadlines_whatever_order_they_began_in(module_server, qname):
    """One timer per queue serves every waiter: a later, shorter wait is not held up by an
    earlier, longer one, and a waiter woken by an item leaves the others' timing alone. Checked
    by order: the short wait ends while the older, longer ones still wait; the item then goes to
    the oldest, and the middle one ends at its own deadline, not before."""
    long_wait, middle_wait, short_wait = (module_server.client() for _ in range(3))
    start = time.monotonic()
    long_wait.send(b"get %s/t=%s\r\n" % (qname.encode(), LONG))
    wait_waiters(module_server, qname, 1)
    middle_wait.send(b"get %s/t=5000\r\n" % qname.encode())  # far beyond the short one, even under load
    wait_waiters(module_server, qname, 2)
    short_wait.send(b"get %s/t=400\r\n" % qname.encode())
    expect(short_wait, b"END\r\n")
    assert readable([long_wait, middle_wait], 0) == []  # the older, longer waits still wait
    fill(module_server.client(), qname, b"first")
    expect(long_wait, value(qname, b"first"))  # the oldest waiter takes the item
    expect(middle_wait, b"END\r\n")
    assert time.monotonic() - start >= 4.95  # its own deadline, not the short one's
    assert queue_stat(module_server, qname, "waiters") == "0"


def test_blocking_open_read_is_woken_and_opens_the_item(module_server, qname):
    reader, writer = module_server.client(), module_server.client()
    reader.send(b"get %s/open/t=%s\r\n" % (qname.encode(), LONG))
    wait_waiters(module_server, qname, 1)
    fill(writer, qname, b"job")
    expect(reader, value(qname, b"job"))
    stats = stats_of(module_server)
    assert (stats[f"queue_{qname}_items"], stats[f"queue_{qname}_open_transactions"]) == ("0", "1")
    reader.send(b"get %s/close\r\n" % qname.encode())
    expect(reader, b"END\r\n")
    assert queue_stat(module_server, qname, "open_transactions") == "0"


def test_blocking_peek_is_woken_and_leaves_the_item(module_server, qname):
    reader, writer = module_server.client(), module_server.client()
    reader.send(b"get %s/peek/t=%s\r\n" % (qname.encode(), LONG))
    wait_waiters(module_server, qname, 1)
    fill(writer, qname, b"look")
    expect(reader, value(qname, b"look"))
    assert queue_stat(module_server, qname, "items") == "1"


def test_one_set_wakes_exactly_one_of_several_waiters(module_server, qname):
    readers = []
    for n in range(1, 4):
        reader = module_server.client()
        reader.send(b"get %s/t=%s\r\n" % (qname.encode(), LONG))
        wait_waiters(module_server, qname, n)
        readers.append(reader)
    writer = module_server.client()
    fill(writer, qname, b"only-one")
    woken = readable(readers, PATIENCE)
    assert len(woken) == 1
    expect(woken[0], value(qname, b"only-one"))
    assert woken[0] is readers[0], "the oldest waiter is woken first (behaviour §5.4)"
    rest = [r for r in readers if r is not woken[0]]
    assert readable(rest, 0.3) == []
    assert queue_stat(module_server, qname, "waiters") == "2"
    fill(writer, qname, b"second", b"third")
    got = set()
    for r in rest:
        line = r.read_line()
        assert line.startswith(b"VALUE %s 0 " % qname.encode())
        data = r.read_exact(int(line.split()[3]) + 2)[:-2]
        expect(r, b"END\r\n")
        got.add(data)
    assert got == {b"second", b"third"}
    assert queue_stat(module_server, qname, "waiters") == "0"


def test_fifty_blocked_readers_each_get_a_distinct_item(module_server, qname):
    readers = [module_server.client() for _ in range(50)]
    for r in readers:
        r.send(b"get %s/t=%s\r\n" % (qname.encode(), LONG))
    wait_waiters(module_server, qname, 50)
    items = [b"item-%02d" % i for i in range(50)]
    writer = module_server.client()
    fill(writer, qname, *items)
    got = []
    for r in readers:
        line = r.read_line()
        assert line == b"VALUE %s 0 7" % qname.encode()
        got.append(r.read_exact(9)[:-2])
        expect(r, b"END\r\n")
    assert sorted(got) == items
    stats = stats_of(module_server)
    assert (stats[f"queue_{qname}_waiters"], stats[f"queue_{qname}_items"]) == ("0", "0")


def test_hung_up_waiter_does_not_swallow_the_next_item(module_server, qname):
    gone = module_server.client()
    gone.send(b"get %s/t=5000\r\n" % qname.encode())
    wait_waiters(module_server, qname, 1)
    gone.close()
    wait_waiters(module_server, qname, 0)
    writer = module_server.client()
    fill(writer, qname, b"keep-me")
    time.sleep(0.1)
    assert queue_stat(module_server, qname, "items") == "1"
    reader = module_server.client()
    reader.send(b"get %s/t=1000\r\n" % qname.encode())
    expect(reader, value(qname, b"keep-me"))


def test_hung_up_waiter_passes_the_item_to_the_next_waiter(module_server, qname):
    """The item goes to the waiter still there, long before its minute-long deadline."""
    gone, stays = module_server.client(), module_server.client()
    gone.send(b"get %s/t=%s\r\n" % (qname.encode(), LONG))
    wait_waiters(module_server, qname, 1)
    stays.send(b"get %s/t=%s\r\n" % (qname.encode(), LONG))
    wait_waiters(module_server, qname, 2)
    gone.close()
    wait_waiters(module_server, qname, 1)
    fill(module_server.client(), qname, b"for-the-living")
    expect(stays, value(qname, b"for-the-living"))


def test_hung_up_waiter_then_immediate_set_keeps_the_item(module_server, qname):
    """The set races the hang-up: whichever the server sees first, the item must survive."""
    gone = module_server.client()
    gone.send(b"get %s/t=5000\r\n" % qname.encode())
    wait_waiters(module_server, qname, 1)
    gone.close()
    time.sleep(0.05)
    fill(module_server.client(), qname, b"survivor")
    wait_waiters(module_server, qname, 0)
    assert drain_queue(module_server, qname) == [b"survivor"]


def test_the_last_timeout_option_wins(module_server, qname):
    """``/t=<a minute>/t=200`` waits 200 ms: END no sooner (a wait happened at all), and within
    the clients' patience, not the minute of the first option."""
    c = module_server.client()
    start = time.monotonic()
    c.send(b"get %s/t=%s/t=200\r\n" % (qname.encode(), LONG))
    expect(c, b"END\r\n")
    assert time.monotonic() - start >= 0.19


@pytest.mark.parametrize("options", [f"/abort/t={LONG_WAIT_MS}", f"/close/t={LONG_WAIT_MS}",
                                     f"/t={LONG_WAIT_MS}/close"])
def test_abort_or_close_alone_never_waits(module_server, qname, options):
    """END long before the minute-long deadline: the read never waited."""
    c = module_server.client()
    c.send(b"get %s%s\r\n" % (qname.encode(), options.encode()))
    expect(c, b"END\r\n")


def test_close_open_with_timeout_confirms_then_waits(module_server, qname):
    c, writer = module_server.client(), module_server.client()
    fill(writer, qname, b"A")
    c.send(b"get %s/open\r\n" % qname.encode())
    expect(c, value(qname, b"A"))
    c.send(b"get %s/close/open/t=%s\r\n" % (qname.encode(), LONG))
    wait_waiters(module_server, qname, 1)
    assert queue_stat(module_server, qname, "open_transactions") == "0"  # A confirmed before waiting
    fill(writer, qname, b"B")
    expect(c, value(qname, b"B"))


def test_blocking_get_holds_up_later_pipelined_commands(module_server, qname):
    """The pipelined VERSION answers only after the wait's END (order), which comes no sooner
    than its deadline. (No window of silence is asserted: a loaded machine can hold this test
    back past the deadline, and an END before it fails the bound below all the same.)"""
    c = module_server.client()
    start = time.monotonic()
    c.send(b"get %s/t=500\r\nversion\r\nget %s\r\n" % (qname.encode(), qname.encode()))
    expect(c, b"END\r\n")  # first: the VERSION sent behind the wait did not overtake it
    assert time.monotonic() - start >= 0.49
    assert c.read_line().startswith(b"VERSION ")
    expect(c, b"END\r\n")


def test_blocked_connection_does_not_block_other_connections(module_server, qname):
    """Another connection is answered while the first still waits (its minute-long deadline
    far off): the waiter is still counted after the other's reply."""
    blocked, other = module_server.client(), module_server.client()
    blocked.send(b"get %s/t=%s\r\n" % (qname.encode(), LONG))
    wait_waiters(module_server, qname, 1)
    other.send(b"version\r\n")
    assert other.read_line().startswith(b"VERSION ")
    assert queue_stat(module_server, qname, "waiters") == "1"
    assert readable([blocked], 0) == []


def test_abort_wakes_a_waiter(module_server, qname):
    holder, waiter = module_server.client(), module_server.client()
    fill(holder, qname, b"A")
    holder.send(b"get %s/open\r\n" % qname.encode())
    expect(holder, value(qname, b"A"))
    waiter.send(b"get %s/t=%s\r\n" % (qname.encode(), LONG))
    wait_waiters(module_server, qname, 1)
    holder.send(b"get %s/abort\r\n" % qname.encode())
    expect(holder, b"END\r\n")
    expect(waiter, value(qname, b"A"))


def test_disconnect_with_open_item_wakes_a_waiter(module_server, qname):
    holder, waiter = module_server.client(), module_server.client()
    fill(holder, qname, b"A")
    holder.send(b"get %s/open\r\n" % qname.encode())
    expect(holder, value(qname, b"A"))
    waiter.send(b"get %s/t=%s\r\n" % (qname.encode(), LONG))
    wait_waiters(module_server, qname, 1)
    holder.close()
    expect(waiter, value(qname, b"A"))  # long before the waiter's minute-long deadline


def test_delete_wakes_all_waiters_with_end(module_server, qname):
    waiters = [module_server.client() for _ in range(3)]
    for n, w in enumerate(waiters, 1):
        w.send(b"get %s/t=%s\r\n" % (qname.encode(), LONG))
        wait_waiters(module_server, qname, n)
    c = module_server.client()
    c.send(b"delete %s\r\n" % qname.encode())
    expect(c, b"DELETED\r\n")
    for w in waiters:
        expect(w, b"END\r\n")  # long before their minute-long deadlines


# -- behaviour §2.7 / behaviour §10.14 MONITOR and CONFIRM ----------------------------------------------------------


def test_monitor_streams_n_items_then_a_final_end(wide_server, qname):
    c = wide_server.client()
    fill(c, qname, b"A", b"B", b"C")
    c.send(b"monitor %s 60 2\r\n" % qname.encode())
    # stopped by the count, not the minute-long deadline
    expect(c, value(qname, b"A") + value(qname, b"B") + b"END\r\n")
    stats = stats_of(wide_server)
    assert (stats[f"queue_{qname}_items"], stats[f"queue_{qname}_open_transactions"]) == ("1", "2")
    c.send(b"confirm %s 2\r\n" % qname.encode())
    expect(c, b"END\r\n")
    stats = stats_of(wide_server)
    assert (stats[f"queue_{qname}_items"], stats[f"queue_{qname}_open_transactions"]) == ("1", "0")
    c.close()
    time.sleep(0.1)
    assert drain_queue(wide_server, qname) == [b"C"]


def test_monitor_n_items_produce_n_plus_one_ends(wide_server, qname):
    c = wide_server.client()
    items = [b"i%d" % i for i in range(5)]
    fill(c, qname, *items)
    c.send(b"monitor %s 1 5\r\n" % qname.encode())
    expect(c, b"".join(value(qname, i) for i in items) + b"END\r\n")
    c.send(b"confirm %s 5\r\n" % qname.encode())
    expect(c, b"END\r\n")


def test_monitor_with_fewer_items_waits_until_the_deadline(wide_server, qname):
    c = wide_server.client()
    fill(c, qname, b"only")
    start = time.monotonic()
    c.send(b"monitor %s 1 3\r\nversion\r\n" % qname.encode())
    expect(c, value(qname, b"only"))
    expect(c, b"END\r\n")  # a final END before the deadline fails the bound below
    assert time.monotonic() - start >= 0.95  # the deadline, not before
    assert c.read_line().startswith(b"VERSION ")  # held up until the final END


def test_monitor_on_an_empty_queue_ends_at_the_deadline(wide_server, qname):
    c = wide_server.client()
    start = time.monotonic()
    c.send(b"monitor %s 1 2\r\n" % qname.encode())
    expect(c, b"END\r\n")
    assert time.monotonic() - start >= 0.95  # the deadline, not before
    assert queue_stat(wide_server, qname, "items") == "0"  # monitor created the queue


def test_monitor_streams_items_set_while_it_runs(wide_server, qname):
    c, writer = wide_server.client(), wide_server.client()
    c.send(b"monitor %s 60 3\r\n" % qname.encode())
    wait_waiters(wide_server, qname, 1)
    for data in (b"X", b"Y", b"Z"):
        fill(writer, qname, data)
        expect(c, value(qname, data))
    expect(c, b"END\r\n")  # the count reached, long before the minute-long deadline
    assert queue_stat(wide_server, qname, "open_transactions") == "3"


def test_monitor_default_count_is_the_open_transaction_limit(wide_server, qname):
    c = wide_server.client()
    items = [b"%02d" % i for i in range(12)]
    fill(c, qname, *items)
    c.send(b"monitor %s 1\r\n" % qname.encode())
    expect(c, b"".join(value(qname, i) for i in items[:10]) + b"END\r\n")
    assert queue_stat(wide_server, qname, "open_transactions") == "10"


def test_monitor_may_hold_max_items_open_beyond_the_open_transaction_limit(module_server, qname):
    # A documented difference from Kestrel (issue 2, README): monitor may hold up to its
    # max_items argument open even with max_open_transactions = 1, so batch consumers work
    # with the defaults.
    c = module_server.client()
    fill(c, qname, b"A", b"B", b"C")
    c.send(b"monitor %s 1 3\r\n" % qname.encode())
    expect(c, value(qname, b"A") + value(qname, b"B") + value(qname, b"C") + b"END\r\n")
    assert queue_stat(module_server, qname, "open_transactions") == "3"
    c.send(b"confirm %s 3\r\n" % qname.encode())
    expect(c, b"END\r\n")
    assert queue_stat(module_server, qname, "open_transactions") == "0"


def test_monitor_counts_reads_already_open_against_max_items(module_server, qname):
    c = module_server.client()
    fill(c, qname, b"A", b"B", b"C")
    c.send(b"get %s/open\r\n" % qname.encode())
    expect(c, value(qname, b"A"))
    c.send(b"monitor %s 60 2\r\n" % qname.encode())
    expect(c, value(qname, b"B") + b"END\r\n")  # the count reached, not the deadline
    assert queue_stat(module_server, qname, "items") == "1"


def test_monitor_max_items_is_capped_by_the_server(make_server, qname):
    server = make_server("--monitor-max-items", "2")
    c = server.client()
    fill(c, qname, b"A", b"B", b"C")
    c.send(b"monitor %s 60 10\r\n" % qname.encode())
    expect(c, value(qname, b"A") + value(qname, b"B") + b"END\r\n")  # the cap reached, not the deadline
    assert queue_stat(server, qname, "items") == "1"


def test_monitor_disconnect_without_confirm_returns_items_to_the_head(wide_server, qname):
    c = wide_server.client()
    fill(c, qname, b"A", b"B", b"C")
    c.send(b"monitor %s 1 2\r\n" % qname.encode())
    expect(c, value(qname, b"A") + value(qname, b"B") + b"END\r\n")
    c.close()
    wait_queue_stat(wide_server, qname, "open_transactions", "0")
    assert queue_stat(wide_server, qname, "items") == "3"
    assert drain_queue(wide_server, qname) == [b"B", b"A", b"C"]  # reverse opening order (behaviour §2.6)


def test_monitor_items_confirmed_one_by_one_oldest_first(wide_server, qname):
    c = wide_server.client()
    fill(c, qname, b"A", b"B", b"C")
    c.send(b"monitor %s 1 3\r\n" % qname.encode())
    expect(c, value(qname, b"A") + value(qname, b"B") + value(qname, b"C") + b"END\r\n")
    q = qname.encode()
    c.send(b"confirm %s 1\r\nconfirm %s 4\r\nconfirm %s 1\r\n" % (q, q, q))
    expect(c, b"END\r\nERROR\r\nEND\r\n")
    assert queue_stat(wide_server, qname, "open_transactions") == "1"
    c.close()
    wait_queue_stat(wide_server, qname, "open_transactions", "0")
    assert drain_queue(wide_server, qname) == [b"C"]


def test_monitor_with_zero_items_sends_only_end(wide_server, qname):
    c = wide_server.client()
    fill(c, qname, b"A")
    c.send(b"monitor %s 60 0\r\n" % qname.encode())
    expect(c, b"END\r\n")  # at once, not at the minute-long deadline
    stats = stats_of(wide_server)
    assert (stats[f"queue_{qname}_items"], stats[f"queue_{qname}_open_transactions"]) == ("1", "0")


def test_monitor_without_arguments_is_client_error_and_stays_open(module_server):
    c = module_server.client()
    c.send(b"monitor\r\n")
    expect(c, b"CLIENT_ERROR\r\n")
    assert_still_open(c)


def test_monitor_without_seconds_drops(module_server, qname):
    c = module_server.client()
    c.send(b"monitor %s\r\n" % qname.encode())
    assert_dropped(c)


def test_monitor_non_numeric_count_drops(module_server, qname):
    c = module_server.client()
    c.send(b"monitor %s 1 x\r\n" % qname.encode())
    assert_dropped(c)


def test_monitor_illegal_queue_name_drops(module_server):
    c = module_server.client()
    c.send(b"monitor a.b 1 1\r\n")
    assert_dropped(c)
    assert not wait_for(lambda: any("a.b" in k for k in stats_of(module_server)), 0.2)
