"""The ``stamp`` option (ours, behaviour §2.5 and §2.7): a GET key's ``/stamp`` and monitor's
fifth token put each item's enqueue time (epoch ms, kept in the journal) on its ``VALUE``
line as a fifth field; without it (or with another fifth token) every reply is Kestrel's."""

from __future__ import annotations

import time

from ..helpers import expect, set_cmd, value


def _stamped(client, queue: str, data: bytes) -> int:
    """Read one ``VALUE <queue> 0 <len> <stamp>`` block (without the END) and return the stamp."""
    line = client.read_line()
    head, stamp = line.rsplit(b" ", 1)
    assert head == b"VALUE %s 0 %d" % (queue.encode(), len(data))
    assert client.read_exact(len(data) + 2) == data + b"\r\n"
    return int(stamp)


def test_get_and_monitor_with_stamp_give_the_enqueue_time_kept_across_a_restart(server, qname):
    q = qname.encode()
    c = server.client()
    before = int(time.time() * 1000)
    c.send(set_cmd(qname, b"first"))
    expect(c, b"STORED\r\n")
    time.sleep(0.05)
    c.send(set_cmd(qname, b"second") + set_cmd(qname, b"third") + set_cmd(qname, b"fourth"))
    expect(c, b"STORED\r\n" * 3)
    after = int(time.time() * 1000)

    c.send(b"get %s/peek/stamp\r\n" % q)
    first = _stamped(c, qname, b"first")
    expect(c, b"END\r\n")
    assert before <= first <= after
    c.send(b"get %s/peek\r\n" % q)  # without the option: Kestrel's reply
    expect(c, value(qname, b"first"))
    c.close()

    server.restart()  # the enqueue times come back from the journal
    c = server.client()
    c.send(b"get %s/open/stamp\r\n" % q)
    assert _stamped(c, qname, b"first") == first
    expect(c, b"END\r\n")
    c.send(b"get %s/close\r\n" % q)  # the open read counts against monitor's limit
    expect(c, b"END\r\n")
    c.send(b"monitor %s 1 2 stamp\r\n" % q)
    second = _stamped(c, qname, b"second")
    expect(c, b"END\r\n")
    third = _stamped(c, qname, b"third")
    expect(c, b"END\r\nEND\r\n")
    assert first + 50 <= second <= third <= after
    c.send(b"confirm %s 2\r\n" % q)
    expect(c, b"END\r\n")
    c.send(b"monitor %s 1 1\r\n" % q)  # without the option: Kestrel's stream
    expect(c, value(qname, b"fourth") + b"END\r\n")
    c.send(b"confirm %s 1\r\n" % q)
    expect(c, b"END\r\n")
    c.send(set_cmd(qname, b"x") + b"monitor %s 1 1 STAMP\r\n" % q)  # ignored, as Kestrel does
    expect(c, b"STORED\r\n" + value(qname, b"x") + b"END\r\n")
    c.close()

