"""Pipelined bursts of plain GETs (``get q`` repeated in one write): exact bytes and counts.

A burst's repeated GETs join one batch as one shared operation, the queue takes them as a run
and the session answers them in one loop (ADR 0021); none of that may show on the wire, in
STATS or in the journal. Each test talks to a real ``kestrel-actors serve`` process.
"""

from __future__ import annotations

import signal

from ..helpers import expect, fill, queue_stat, set_cmd, stats_of, value


def _get(queue: str, options: str = "") -> bytes:
    return b"get %s%s\r\n" % (queue.encode(), options.encode())


def test_a_burst_of_gets_answers_hits_in_order_then_misses(module_server, qname):
    items = [b"item-%d-" % i + b"x" * i for i in range(20)]  # sizes differ: each VALUE line too
    c = module_server.client()
    fill(c, qname, *items)
    before = stats_of(module_server)
    c.send(_get(qname) * 32)
    expect(c, b"".join(value(qname, item) for item in items) + b"END\r\n" * 12)
    after = stats_of(module_server)
    for name, grew in (("cmd_get", 32), ("get_hits", 20), ("get_misses", 12)):
        assert int(after[name]) - int(before[name]) == grew, name
    assert after[f"queue_{qname}_items"] == "0"


def test_repeated_gets_mixed_with_other_requests_keep_their_order(module_server, qname):
    other = qname + "_other"
    c = module_server.client()
    fill(c, qname, b"a", b"b", b"c", b"d", b"e", b"f")
    fill(c, other, b"O")
    c.send(
        _get(qname) * 2 + _get(qname, "/peek") * 2 + _get(qname) * 2 + _get(other) + _get(qname) * 2
        + set_cmd(qname, b"g") + _get(qname) * 3
    )
    expect(
        c,
        value(qname, b"a") + value(qname, b"b") + value(qname, b"c") * 3 + value(qname, b"d")
        + value(other, b"O") + value(qname, b"e") + value(qname, b"f") + b"STORED\r\n"
        + value(qname, b"g") + b"END\r\n" * 2,
    )
    assert queue_stat(module_server, qname, "items") == "0"


def test_a_burst_stops_at_items_that_expire_and_goes_on_after_them(module_server, qname):
    c = module_server.client()
    # absolute exptimes: 1970 (long expired) and 2033 (not yet)
    c.send(set_cmd(qname, b"A") + set_cmd(qname, b"old", exptime=1_000_000)
           + set_cmd(qname, b"B", exptime=2_000_000_000) + set_cmd(qname, b"C"))
    expect(c, b"STORED\r\n" * 4)
    c.send(_get(qname) * 5)
    expect(c, value(qname, b"A") + value(qname, b"B") + value(qname, b"C") + b"END\r\n" * 2)
    assert queue_stat(module_server, qname, "expired_items") == "1"


def test_a_burst_past_a_batch_output_budget_is_answered_whole_and_in_order(module_server, qname):
    # 24 items of 100 KiB: more than a batch's 1 MiB of fetches, so the queue answers in parts
    items = [bytes([65 + i]) * (100 * 1024) for i in range(24)]
    c = module_server.client()
    fill(c, qname, *items)
    c.send(_get(qname) * 30)
    expect(c, b"".join(value(qname, item) for item in items) + b"END\r\n" * 6)
    assert queue_stat(module_server, qname, "items") == "0"


def test_what_a_burst_took_stays_taken_after_a_restart(make_server):
    server = make_server()
    c = server.client()
    fill(c, "burst", *[b"%03d" % i for i in range(40)])
    c.send(_get("burst") * 25)
    expect(c, b"".join(value("burst", b"%03d" % i) for i in range(25)))
    c.close()
    server.restart(signal.SIGKILL)  # the REMOVE records were written before the replies were sent
    c = server.client()
    c.send(_get("burst") * 16)
    expect(c, b"".join(value("burst", b"%03d" % i) for i in range(25, 40)) + b"END\r\n")


def test_a_command_for_no_queue_after_a_burst_is_run_on_its_own(module_server, qname):
    c = module_server.client()
    fill(c, qname, b"a", b"b")
    c.send(_get(qname) * 3 + b"version\r\n" + _get(qname))
    expect(c, value(qname, b"a") + value(qname, b"b") + b"END\r\n")
    assert c.read_line().startswith(b"VERSION ")
    expect(c, b"END\r\n")
