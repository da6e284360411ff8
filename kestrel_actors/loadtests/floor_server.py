"""A floor for issue 12: the least a gevent server in Python does for one SET, nothing more.

    python -m kestrel_actors.loadtests.floor_server PORT [JOURNAL_FILE] [--sync-journal always]

Not kestrel-actors: one libev I/O watcher per connection, memcache's ``set`` parsed, the item
appended to one file with ``os.writev``, ``STORED`` sent. A ``get`` takes the oldest item of one
in-memory deque (every queue name is the same queue), appends a one-byte REMOVE record and sends
``VALUE``; on an empty deque a ``get q/t=MS`` parks the connection, oldest first, with a libev
timer of its own, until a ``set`` hands it the item or the timer answers ``END``. ``/open`` reads
as a plain get (nothing is held open: no ``/close``, no abort, no hang-up return); every other
line gets ``END``. No actors, sessions, batches, stats or durability rules. Run ``put-many -c 1
-F -p PORT`` (or get-many, flood, many-clients without ``-x``) against it to see what the
interpreter, gevent and the kernel cost per request on this machine, against which
kestrel-actors' CPU per request can be read (ADR 0007, ADR 0020).

With ``--sync-journal always`` it is the floor of the durable row (ADR 0018): a ``STORED``
waits for an ``fdatasync`` covering its record, and the records that come while one runs share
the next (a group commit). The least machinery that does it: the records pile up in a list, a
round writes them with one ``writev`` and hands the ``fdatasync`` to gevent's threadpool, and
its end sends the replies and starts the next round at once if records are waiting. No
gathering policy, no failure handling, no holds, and an ``END`` goes at once, ahead of any
``STORED`` still waiting (a floor, not a server). On SIGTERM it prints ``rounds records`` (the
fdatasyncs and the records they covered) and exits.

It polls before it sleeps as the server does (``--busy-poll``, the server's default; ADR 0025),
with the server's own :class:`BusyPoll`, so that its rows stay like for like with the server's.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import gevent
import gevent.socket

from ..config import duration
from ..session import BusyPoll

if TYPE_CHECKING:
    from gevent._types import _IoWatcher  # the stubs' type of a loop's io watcher (no runtime name)


class GroupCommit:
    """With ``--sync-journal always``: the records waiting for a round, and the round in flight."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.hub = gevent.get_hub()
        self.chunks: list[bytes] = []
        self.waiting: list[socket.socket] = []
        """Connections whose records are in :attr:`chunks`, one entry per record."""
        self.syncing: list[socket.socket] = []
        """Connections whose records the fdatasync in flight covers (empty: none in flight)."""
        self.rounds = 0
        self.records = 0

    def add(self, record: list[bytes], sock: socket.socket) -> None:
        self.chunks += record
        self.waiting.append(sock)
        if not self.syncing:
            self.start_round()

    def start_round(self) -> None:
        os.writev(self.fd, self.chunks)
        self.chunks = []
        self.syncing, self.waiting = self.waiting, []
        self.rounds += 1
        self.records += len(self.syncing)
        self.hub.threadpool.spawn(os.fdatasync, self.fd).rawlink(self.synced)

    def synced(self, _result: Any) -> None:
        answered, self.syncing = self.syncing, []
        for sock in answered:
            try:
                sock.send(b"STORED\r\n")
            except OSError:
                pass  # that client went away; the others still get their replies
        if self.waiting:
            self.start_round()


class Store:
    """The one queue: its items, and the connections parked on it (oldest first)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.loop = gevent.get_hub().loop
        self.items: deque[bytes] = deque()
        self.parked: deque[Parked] = deque()

    def put(self, body: bytes) -> None:
        parked = self.parked
        while parked:
            reader = parked.popleft()
            if reader.waiting:
                reader.answer(self.take(reader.queue, body))
                return
        self.items.append(body)

    def take(self, queue: bytes, body: bytes) -> bytes:
        os.write(self.fd, b"\x04")
        return b"VALUE %b 0 %d\r\n%b\r\nEND\r\n" % (queue, len(body), body)


class Parked:
    """A connection whose ``get q/t=MS`` waits for an item or its timer."""

    __slots__ = ("sock", "queue", "timer", "waiting", "resume")

    def __init__(self, sock: socket.socket, queue: bytes, store: Store, timeout_ms: int,
                 resume: Callable[[], None]) -> None:
        self.sock = sock
        self.queue = queue
        self.waiting = True
        self.resume = resume
        self.timer = store.loop.timer(timeout_ms / 1000.0)
        self.timer.start(self.answer, b"END\r\n")

    def answer(self, reply: bytes) -> None:
        self.waiting = False
        self.timer.close()
        try:
            self.sock.send(reply)
        except OSError:
            return
        self.resume()


def serve(port: int, journal: str, sync_journal: str = "never", busy_poll: float = 0.0002) -> None:
    hub = gevent.get_hub()
    poll = BusyPoll.of(hub.loop)
    poll.seconds = busy_poll
    fd = os.open(journal, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    commit = GroupCommit(fd) if sync_journal == "always" else None
    store = Store(fd)
    if commit is not None:
        hub.loop.signal(signal.SIGTERM).start(lambda: _report(commit))
    listener = gevent.socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(128)
    while True:
        accepted, _address = listener.accept()
        sock = socket.socket(fileno=os.dup(accepted.fileno()))
        accepted.close()
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        watcher = hub.loop.io(sock.fileno(), 1)
        watcher.start(_reader(sock, watcher, fd, commit, store, poll))


def _report(commit: GroupCommit) -> None:
    print(commit.rounds, commit.records, flush=True)
    os._exit(0)


def _reader(sock: socket.socket, watcher: _IoWatcher, fd: int, commit: GroupCommit | None,
            store: Store, poll: BusyPoll) -> Callable[[], None]:
    buffer = bytearray()
    parked: list[Parked] = []

    def readable() -> None:
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return
        poll.touch()
        if not data:
            watcher.stop()
            if parked:
                parked[0].waiting = False
                parked[0].timer.close()
            sock.close()
            return
        buffer.extend(data)
        if not parked:
            answer()

    def resume() -> None:
        parked.clear()
        if buffer:
            answer()

    def answer() -> None:
        replies = []
        while True:
            eol = buffer.find(b"\r\n")
            if eol < 0:
                break
            tokens = bytes(buffer[:eol]).split()
            if tokens and tokens[0] == b"set" and len(tokens) >= 5:
                size = int(tokens[4])
                if len(buffer) < eol + 2 + size + 2:
                    break
                body = bytes(buffer[eol + 2:eol + 2 + size])
                del buffer[:eol + 2 + size + 2]
                record = [b"\x02" + size.to_bytes(4, "little"), body]
                if commit is not None:
                    commit.add(record, sock)  # STORED when its fdatasync ends
                    store.put(body)
                    continue
                os.writev(fd, record)
                store.put(body)
                replies.append(b"STORED\r\n")
            elif tokens and tokens[0] == b"get" and len(tokens) == 2:
                del buffer[:eol + 2]
                queue, *options = tokens[1].split(b"/")
                if (b"close" in options and b"open" not in options) or b"abort" in options:
                    replies.append(b"END\r\n")
                elif store.items:
                    replies.append(store.take(queue, store.items.popleft()))
                else:
                    timeout = next((int(option[2:]) for option in options if option.startswith(b"t=")), 0)
                    if timeout <= 0:
                        replies.append(b"END\r\n")
                        continue
                    if replies:
                        sock.send(b"".join(replies))
                    parked.append(Parked(sock, queue, store, timeout, resume))
                    store.parked.append(parked[0])
                    return  # the rest of the buffer waits for this get's answer
            elif tokens and tokens[0] == b"flush":
                del buffer[:eol + 2]
                store.items.clear()
                replies.append(b"END\r\n")
            else:
                del buffer[:eol + 2]
                replies.append(b"END\r\n")
        if replies:
            sock.send(b"".join(replies))

    return readable


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kestrel_actors.loadtests.floor_server",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("port", type=int)
    parser.add_argument("journal", nargs="?", default="/tmp/floor_server.journal")
    parser.add_argument("--sync-journal", choices=("never", "always"), default="never",
                        help="always: reply only after an fdatasync covers the record (group commit)")
    parser.add_argument("--busy-poll", type=lambda text: duration(text, bare_seconds=True), default=0.0002,
                        help="poll without sleeping for this long after a read, as the server does "
                             "(default 200us; 0: sleep at once)")
    opts = parser.parse_args(argv)
    serve(opts.port, opts.journal, opts.sync_journal, opts.busy_poll)


if __name__ == "__main__":
    main(sys.argv[1:])
