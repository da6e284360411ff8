"""A floor for issue 12: the least a gevent server in Python does for one SET, nothing more.

    python -m kestrel_actors.loadtests.floor_server PORT [JOURNAL_FILE] [--sync-journal always]

Not kestrel-actors and not a queue: one libev I/O watcher per connection, memcache's ``set``
parsed, the item appended to one file with ``os.writev``, ``STORED`` sent; every other line
gets ``END``. No actors, sessions, batches, stats or durability rules. Run ``put-many -c 1
-F -p PORT`` against it to see what the interpreter, gevent and the kernel cost per request
on this machine, against which kestrel-actors' CPU per request can be read
(ADR 0007).

With ``--sync-journal always`` it is the floor of the durable row (ADR 0018): a ``STORED``
waits for an ``fdatasync`` covering its record, and the records that come while one runs share
the next (a group commit). The least machinery that does it: the records pile up in a list, a
round writes them with one ``writev`` and hands the ``fdatasync`` to gevent's threadpool, and
its end sends the replies and starts the next round at once if records are waiting. No
gathering policy, no failure handling, no holds, and an ``END`` goes at once, ahead of any
``STORED`` still waiting (a floor, not a server). On SIGTERM it prints ``rounds records`` (the
fdatasyncs and the records they covered) and exits.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import gevent
import gevent.socket

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


def serve(port: int, journal: str, sync_journal: str = "never") -> None:
    hub = gevent.get_hub()
    fd = os.open(journal, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    commit = GroupCommit(fd) if sync_journal == "always" else None
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
        watcher.start(_reader(sock, watcher, fd, commit))


def _report(commit: GroupCommit) -> None:
    print(commit.rounds, commit.records, flush=True)
    os._exit(0)


def _reader(sock: socket.socket, watcher: _IoWatcher, fd: int, commit: GroupCommit | None) -> Callable[[], None]:
    buffer = bytearray()

    def readable() -> None:
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return
        if not data:
            watcher.stop()
            sock.close()
            return
        buffer.extend(data)
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
                    continue
                os.writev(fd, record)
                replies.append(b"STORED\r\n")
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
    opts = parser.parse_args(argv)
    serve(opts.port, opts.journal, opts.sync_journal)


if __name__ == "__main__":
    main(sys.argv[1:])
