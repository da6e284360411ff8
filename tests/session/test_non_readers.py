"""What clients that send requests and never read cost the server (issue 53 point 4), by counts,
against real server processes (and a transport on a socket pair):

* a client that pipelines 200 peeks of a 64 KiB item and never reads gets one part of replies
  made (a queue's ``BATCH_FETCH_BYTES``), not 4 MiB: the kernel keeps at most
  ``UNSENT_IN_KERNEL`` unsent, and the session makes no more replies while some wait unsent;
  the rest are made, in order, once it reads;
* a fresh client behind a burst of heavy newcomers in the accept backlog is served before most
  of them are set up (each is set up in its turn, one per loop pass).

The timing figures (a fresh client's round trip during a thousand non-readers) are measured by
``kestrel_actors.loadtests.non_readers_bench`` and printed by ``test_memory``; nothing here
depends on the clock beyond "answered at all within seconds".
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import gevent

from kestrel_actors.protocol import MemcacheDecoder
from kestrel_actors.session._budget import BufferBudget
from kestrel_actors.session._transport import SocketTransport
from kestrel_actors.stats import ServerStats

from ..helpers import PATIENCE, fill, numbered, stats_of, unique, value, wait_for

ITEM = 64 * 1024
PEEKS = 200
PART = 1024 * 1024
"""A queue answers a batch of fetches in parts of about this many bytes of items."""


class StatsPoller:
    """``stats`` on one connection of its own, so that what its own replies add to
    ``bytes_written`` can be taken off."""

    def __init__(self, server) -> None:
        self.sock = socket.create_connection((server.host, server.port), timeout=10)
        self.replied = 0
        """Bytes of this poller's replies counted in ``bytes_written`` by the last one."""
        self._last_reply = 0

    def stats(self) -> dict[str, str]:
        self.sock.sendall(b"stats\r\n")
        reply = b""
        while not reply.endswith(b"END\r\n"):
            chunk = self.sock.recv(65536)
            assert chunk, reply
            reply += chunk
        self.replied += self._last_reply  # the reply before this one was counted in it
        self._last_reply = len(reply)
        return {line.split()[1]: line.split()[2] for line in reply.decode().splitlines() if line.startswith("STAT ")}

    def written_by_others(self) -> int:
        """``bytes_written`` less this poller's own replies."""
        return int(self.stats()["bytes_written"]) - self.replied


def test_a_non_reader_gets_one_part_of_replies_made_until_it_reads(server):
    queue = unique("big")
    fill(server.client(), queue, bytes(ITEM))
    reply = value(queue, bytes(ITEM))
    poller = StatsPoller(server)
    before = poller.written_by_others()
    hog = socket.socket()
    hog.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a window that fills at once
    hog.connect((server.host, server.port))
    hog.sendall(b"get %s/peek\r\n" % queue.encode() * PEEKS)
    assert wait_for(lambda: int(poller.stats()["cmd_peek"]) >= PEEKS, 20.0, 0.05)
    # settled: a look taken too early can only find fewer bytes, never more
    made = [-1]

    def settled() -> bool:
        now = poller.written_by_others() - before
        unchanged = now == made[0]
        made[0] = now
        return unchanged

    assert wait_for(settled, 20.0, 0.5)
    # one part: 16 replies of a 64 KiB item (before: 4 MiB, 3 MiB of them taken by the
    # kernel's send buffer, and 1 MiB more kept by the server)
    assert made[0] <= PART + 2 * len(reply), made[0]
    hog.settimeout(30)
    received = bytearray()
    while len(received) < PEEKS * len(reply):
        chunk = hog.recv(1 << 20)
        assert chunk, len(received)
        received += chunk
    assert bytes(received) == reply * PEEKS  # the rest made once it read, whole and in order
    assert poller.written_by_others() - before == PEEKS * len(reply)
    hog.close()


HEAVY_NEWCOMERS = 300

BURST_SCRIPT = r"""
import resource, socket, sys
host, port, count, queue = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, count + 256), hard))
request = b"get %s/peek\r\n" % queue.encode() * 200
clients = []
for _ in range(count):
    client = socket.create_connection((host, port))
    client.sendall(request)
    clients.append(client)
fresh = socket.create_connection((host, port))
fresh.sendall(b"stats\r\n")
print("sent", flush=True)
fresh.settimeout(30)
reply = b""
while not reply.endswith(b"END\r\n"):
    chunk = fresh.recv(65536)
    if not chunk:
        break
    reply += chunk
sys.stdout.write(reply.decode())
sys.stdout.flush()
sys.stdin.read()  # until the test says so
"""


def test_a_fresh_client_behind_a_burst_of_heavy_newcomers_is_served_before_they_are_set_up(server):
    """The server is stopped (SIGSTOP) while a burst of newcomers, each pipelining 200 peeks
    (a heavy first read), and then a fresh client asking for ``stats`` connect: all wait in
    the kernel's accept backlog, the fresh client last. Before, every newcomer ahead of it was
    set up (its session, its transport) before it was accepted, and its ``stats`` counted them
    all in ``curr_connections``. Now they are set up one per loop pass, in their turns, and
    the fresh client is set up and answered at once."""
    queue = unique("item")
    filler = server.client()
    fill(filler, queue, bytes(1024))
    filler.close()
    assert wait_for(lambda: stats_of(server)["curr_connections"] == "1", 10.0, 0.05)  # stats_of's own
    burst = subprocess.Popen(
        [sys.executable, "-c", BURST_SCRIPT, server.host, str(server.port), str(HEAVY_NEWCOMERS), queue],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        assert burst.stdout.readline() == b"sent\n"
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
    try:
        lines = []
        for line in burst.stdout:
            lines.append(line.decode())
            if line == b"END\r\n":
                break
        seen = {line.split()[1]: line.split()[2] for line in lines if line.startswith("STAT ")}
        set_up = int(seen["curr_connections"]) - 1  # the fresh client counts itself
        assert set_up <= HEAVY_NEWCOMERS // 2, (set_up, HEAVY_NEWCOMERS)
        # and every newcomer of the burst is served in its turn
        assert wait_for(lambda: int(stats_of(server)["cmd_peek"]) >= HEAVY_NEWCOMERS * 200, 60.0, 0.1)
    finally:
        burst.stdin.close()
        burst.wait(10)


# -- the transport: replies written as they are, none made while some wait --------------------


def test_parts_that_wait_unsent_mark_the_transport_backed_up_until_the_client_takes_them():
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    resumed: list[list] = []
    transport = SocketTransport(ours, MemcacheDecoder(), resumed.append, lambda: None, ServerStats(),
                                BufferBudget(1 << 30))
    transport.start()
    parts = [bytes([index]) * ITEM for index in range(40)]  # more than a socket pair's buffers
    try:
        transport.send_parts(parts, len(parts) * ITEM)
        assert transport.backed_up  # some wait unsent: the session makes no more
        assert not resumed
        theirs.setblocking(False)
        received = bytearray()

        def read_some() -> bool:
            gevent.sleep(0.001)  # the transport's write watcher runs on this thread's hub
            try:
                received.extend(theirs.recv(1 << 20))
            except BlockingIOError:
                pass
            return len(received) == len(parts) * ITEM

        assert wait_for(read_some, 10.0, 0.0)
        assert bytes(received) == b"".join(parts)
        assert wait_for(lambda: gevent.sleep(0.01) or resumed, PATIENCE, 0.0)
        assert resumed == [[]]  # drained: the session is told to go on, once
        assert not transport.backed_up
    finally:
        transport.close()
        theirs.close()


def test_a_lone_reply_the_kernel_takes_whole_leaves_the_transport_free():
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    transport = SocketTransport(ours, MemcacheDecoder(), lambda _commands: None, lambda: None, ServerStats(),
                                BufferBudget(1 << 30))
    transport.start()
    try:
        transport.send_parts([b"STORED\r\n", b"END\r\n"], 13)
        assert not transport.backed_up
        theirs.settimeout(PATIENCE)
        assert theirs.recv(64) == b"STORED\r\nEND\r\n"
    finally:
        transport.close()
        theirs.close()


LONE_HITS = 40


def test_a_slow_reader_gets_lone_hits_written_in_parts_whole_and_in_order(server):
    """A lone GET hit's reply (header, data, ``END``) of ``LONE_WRITEV_FROM`` bytes or more is
    written as its parts with one ``writev`` (``SessionActor._flush``, ``SocketTransport.send_parts``),
    a smaller one joined. A client reading through a small window makes the kernel take only some
    of them (``TCP_NOTSENT_LOWAT``): the rest, cut in any of the three, is kept and sent from where
    it stopped. The GETs alternate between two queues, so each is a batch, and a flush, of its own;
    the items' sizes differ, so the cuts fall in different places; every reply arrives whole and
    in order."""
    queues = [unique("slow"), unique("slow")]
    # mostly 20-59 KiB (written as parts, below JOIN_BELOW), every fourth 1-7 KiB (joined)
    sizes = [1_000 + 150 * index if index % 4 == 0 else 20_000 + 997 * index for index in range(LONE_HITS)]
    items = [numbered(index, size) for index, size in enumerate(sizes)]
    filler = server.client()
    for queue in queues:
        fill(filler, queue, *items[queues.index(queue)::2])
    filler.close()
    reader = socket.socket()
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a window that fills at once
    reader.connect((server.host, server.port))
    reader.sendall(b"".join(b"get %s\r\n" % queues[index % 2].encode() for index in range(LONE_HITS)))
    expected = b"".join(value(queues[index % 2], item) for index, item in enumerate(items))
    reader.settimeout(30)
    received = bytearray()
    while len(received) < len(expected):
        chunk = reader.recv(4096)  # a slow reader: a small window, a small read at a time
        assert chunk, len(received)
        received += chunk
    reader.close()
    assert bytes(received) == expected
