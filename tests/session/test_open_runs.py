"""A connection's open reads held as runs of consecutive xids (``session/_opened.py``): ``OpenXids``
alone, and a session confirming, closing and aborting through it against a real queue (ADR 0022)."""

from __future__ import annotations

from kestrel_actors.messages import XidRun
from kestrel_actors.queue import XID_MAX, Item
from kestrel_actors.session._opened import OpenXids


def spans(runs: list[XidRun] | None) -> list[tuple[int, int]] | None:
    return None if runs is None else [(run.first, run.count) for run in runs]


def opened(*xids: int) -> OpenXids:
    held = OpenXids()
    for xid in xids:
        held.add(xid)
    return held


def test_reads_that_follow_one_another_are_one_run_in_the_order_opened():
    held = opened(5, 6, 7, 2, 3, 9)
    assert len(held) == 6 and list(held) == [5, 6, 7, 2, 3, 9]
    assert spans(held.take_all()) == [(5, 3), (2, 2), (9, 1)]
    assert not held and list(held) == [] and held.take_all() == []


def test_a_monitor_steps_items_are_one_run_until_the_xids_wrap():
    held = opened(XID_MAX - 3)
    held.add_items([Item(b"x", 0, 0, xid) for xid in (XID_MAX - 2, XID_MAX - 1, XID_MAX, 1, 2)])
    assert list(held) == [XID_MAX - 3, XID_MAX - 2, XID_MAX - 1, XID_MAX, 1, 2]
    assert spans(held.take_all()) == [(XID_MAX - 3, 4), (1, 2)]


def test_a_confirm_of_fewer_than_a_run_cuts_it_and_keeps_the_rest():
    held = opened(1, 2, 3, 4, 5)
    assert spans(held.take(2)) == [(1, 2)]
    assert len(held) == 3 and list(held) == [3, 4, 5]
    assert spans(held.take(1)) == [(3, 1)]
    assert spans(held.take(2)) == [(4, 2)] and not held


def test_a_confirm_across_runs_takes_the_oldest_whole_and_cuts_the_last():
    held = opened(1, 2, 10, 11, 12, 20)
    assert spans(held.take(4)) == [(1, 2), (10, 2)]
    assert list(held) == [12, 20]
    held.add(21)  # follows the newest run
    assert spans(held.take(3)) == [(12, 1), (20, 2)] and not held


def test_a_count_of_more_than_is_open_or_none_takes_nothing():
    held = opened(1, 2, 3)
    assert held.take(4) is None and held.take(0) is None and held.take(-1) is None
    assert list(held) == [1, 2, 3]


def test_a_run_handed_out_is_not_changed_by_what_the_connection_opens_next():
    held = opened(1, 2)
    taken = held.take(2)
    held.add(3)  # would follow the run taken: a run of its own
    assert spans(taken) == [(1, 2)] and spans(held.take_all()) == [(3, 1)]


# -- a session against a real queue ----------------------------------------------------------


def fill(client, queue: str, count: int) -> None:
    client.send(b"".join(b"set %s 0 0 1\r\n%d\r\n" % (queue.encode(), n % 10) for n in range(1, count + 1)))


def values(*data: bytes, queue: bytes = b"m") -> bytes:
    return b"".join(b"VALUE %s 0 1\r\n%s\r\nEND\r\n" % (queue, one) for one in data)


def test_a_monitor_is_held_as_one_run_and_a_confirm_of_fewer_keeps_the_rest_open(world):
    client = world.connect()
    fill(client, "m", 5)
    core = world.queues["m"].weak_actor().core
    assert client.send(b"monitor m 5 3\r\n") == values(b"1", b"2", b"3") + b"END\r\n"
    assert client.send(b"monitor m 5 5\r\n") == values(b"4", b"5") + b"END\r\n"  # up to 5 open
    held = client.ref.weak_actor().open_reads["m"]
    assert spans(held._runs) == [(1, 5)]  # two steps, one run
    assert client.send(b"confirm m 2\r\n") == b"END\r\n"
    assert list(core.open_reads) == [3, 4, 5] and list(held) == [3, 4, 5]
    assert client.send(b"confirm m 4\r\n") == b"ERROR\r\n"  # more than are open: none confirmed
    assert list(core.open_reads) == [3, 4, 5]
    assert client.send(b"confirm m 3\r\n") == b"END\r\n"
    assert not core.open_reads and not held and core.length == 0


def test_a_confirm_across_runs_confirms_the_oldest_of_this_connection_only(world):
    client, other = world.connect(), world.connect()
    fill(client, "m", 5)
    core = world.queues["m"].weak_actor().core
    assert client.send(b"monitor m 5 2\r\n") == values(b"1", b"2") + b"END\r\n"
    assert other.send(b"get m/open\r\n") == values(b"3")  # xid 3: between this client's runs
    assert client.send(b"monitor m 5 4\r\n") == values(b"4", b"5") + b"END\r\n"
    assert spans(client.ref.weak_actor().open_reads["m"]._runs) == [(1, 2), (4, 2)]
    assert client.send(b"confirm m 3\r\n") == b"END\r\n"
    assert list(core.open_reads) == [3, 5]
    client.hang_up()  # 5 goes back; the other's read stays open
    assert list(core.open_reads) == [3]
    assert world.connect().send(b"get m\r\n") == values(b"5")


def test_a_hang_up_after_a_partial_confirm_gives_the_rest_back_in_kestrels_order(world):
    client = world.connect()
    fill(client, "m", 4)
    assert client.send(b"monitor m 5 4\r\n") == values(b"1", b"2", b"3", b"4") + b"END\r\n"
    assert client.send(b"confirm m 1\r\n") == b"END\r\n"
    client.hang_up()
    # each goes back to the head in the order opened: the last opened first (behaviour §2.6)
    reader = world.connect()
    assert reader.send(b"get m\r\nget m\r\nget m\r\nget m\r\n") == values(b"4", b"3", b"2") + b"END\r\n"
    core = world.queues["m"].weak_actor().core
    assert core.canceled_transactions == 3 and world.stats.cmd_get_open_dropped == 3


def test_close_and_abort_take_the_oldest_read_of_a_monitors_run(world):
    client = world.connect()
    fill(client, "m", 4)
    assert client.send(b"get m/open\r\n") == values(b"1")
    assert client.send(b"monitor m 5 3\r\n") == values(b"2", b"3") + b"END\r\n"
    assert spans(client.ref.weak_actor().open_reads["m"]._runs) == [(1, 3)]  # the /open's run went on
    assert client.send(b"get m/close\r\n") == b"END\r\n"  # confirms 1
    assert client.send(b"get m/abort\r\n") == b"END\r\n"  # 2 goes back
    core = world.queues["m"].weak_actor().core
    assert list(core.open_reads) == [3] and core.length == 2
    assert client.send(b"get m/close/open\r\n") == values(b"2")  # confirms 3, opens 2 again
    assert list(core.open_reads) == [4] and client.send(b"confirm m 1\r\n") == b"END\r\n"
    assert not core.open_reads and world.connect().send(b"get m\r\n") == values(b"4")


def test_a_monitor_across_the_xid_wrap_confirms_and_gives_back_by_xid(world):
    client = world.connect()
    fill(client, "m", 5)
    core = world.queues["m"].weak_actor().core
    core._xid = XID_MAX - 2
    assert client.send(b"monitor m 5 4\r\n") == values(b"1", b"2", b"3", b"4") + b"END\r\n"
    assert list(core.open_reads) == [XID_MAX - 1, XID_MAX, 1, 2]
    assert spans(client.ref.weak_actor().open_reads["m"]._runs) == [(XID_MAX - 1, 2), (1, 2)]
    assert client.send(b"confirm m 3\r\n") == b"END\r\n"
    assert list(core.open_reads) == [2]
    client.hang_up()
    assert world.connect().send(b"get m\r\nget m\r\nget m\r\n") == values(b"4", b"5") + b"END\r\n"


def test_a_confirm_on_a_queue_deleted_meanwhile_counts_against_the_runs(world):
    client = world.connect()
    fill(client, "m", 3)
    assert client.send(b"monitor m 5 3\r\n") == values(b"1", b"2", b"3") + b"END\r\n"
    assert client.send(b"delete m\r\n") == b"DELETED\r\n"
    assert client.send(b"confirm m 2\r\n") == b"END\r\n"
    assert client.send(b"confirm m 2\r\n") == b"ERROR\r\n"
    assert client.send(b"get m/close\r\nconfirm m 1\r\n") == b"END\r\nERROR\r\n"
