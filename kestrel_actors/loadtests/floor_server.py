"""A floor for issue 12: the least a gevent server in Python does for one SET, nothing more.

    python -m kestrel_actors.loadtests.floor_server PORT [JOURNAL_FILE]

Not kestrel-actors and not a queue: one libev I/O watcher per connection, memcache's ``set``
parsed, the item appended to one file with ``os.writev``, ``STORED`` sent; every other line
gets ``END``. No actors, sessions, batches, stats or durability rules. Run ``put-many -c 1
-F -p PORT`` against it to see what the interpreter, gevent and the kernel cost per request
on this machine, against which kestrel-actors' CPU per request can be read
(``docs/benchmarks.md``, "Issue 12: what the profiles show").
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import gevent
import gevent.socket

if TYPE_CHECKING:
    from gevent._types import _IoWatcher  # the stubs' type of a loop's io watcher (no runtime name)


def serve(port: int, journal: str) -> None:
    hub = gevent.get_hub()
    fd = os.open(journal, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
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
        watcher.start(_reader(sock, watcher, fd))


def _reader(sock: socket.socket, watcher: _IoWatcher, fd: int) -> Callable[[], None]:
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
                os.writev(fd, [b"\x02" + size.to_bytes(4, "little"), body])
                replies.append(b"STORED\r\n")
            else:
                del buffer[:eol + 2]
                replies.append(b"END\r\n")
        if replies:
            sock.send(b"".join(replies))

    return readable


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "/tmp/floor_server.journal")
