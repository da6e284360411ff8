"""The server's own CPU time per request, in process and without sockets.

    python -m kestrel_actors.loadtests.path_bench [--rounds 5] [--only NAME]

The load tests measure a client and a server sharing two noisy cores; small changes to the
request path drown in that noise. This drives the real session, queue and journal actors of
one :class:`~kestrel_actors.server.Server` (file journals in a temporary directory) from the
same process, with each connection's socket replaced by a buffer: decoded requests go in
through the dispatcher as the transport would hand them over, replies are collected. What is
left out is the system calls of the sockets and the event loop. Each scenario runs
``--rounds`` times; the least CPU time per request is reported, the figure least disturbed
by other work on the machine.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable

import gevent

from kestrel_actors.actors import Session
from kestrel_actors.config import ServerConfig
from kestrel_actors.journal import make_file_opener
from kestrel_actors.logs import configure_logging
from kestrel_actors.protocol import MemcacheDecoder
from kestrel_actors.runtime import Dispatcher
from kestrel_actors.server import Server
from kestrel_actors.session import Disconnected, MemcacheHandler, Received, SessionActor, Transport

__all__ = ["main"]

ITEM = b"x" * 1024
CLIENTS = 100


class _Buffer(Transport):
    """Stands for a client socket's transport: replies are kept, never sent."""

    def __init__(self) -> None:
        super().__init__()
        self.replies: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        self.replies.append(data)

    def resume(self) -> None:
        pass

    def close(self) -> None:
        pass


class _Client:
    def __init__(self, server: Server, number: int) -> None:
        self.transport = _Buffer()
        self.decoder = MemcacheDecoder()
        self.ref = SessionActor.start(server.context, self.transport, Session(number, "bench"), MemcacheHandler)

    def send(self, data: bytes) -> None:
        Dispatcher.current().deliver(self.ref, Received(self.decoder.feed(data)))

    def hang_up(self) -> None:
        Dispatcher.current().deliver(self.ref, Disconnected())


def _settle() -> None:
    """Let the dispatcher run what was delivered, the queue's held answers, and the rest."""
    dispatcher = Dispatcher.current()
    gevent.sleep(0)
    while dispatcher.due or dispatcher.running:
        gevent.sleep(0.001)  # journal file work on the threadpool: wait without spinning


def _set(server: Server, n: int) -> int:
    clients = [_Client(server, i) for i in range(CLIENTS)]
    request = b"set bench 0 0 %d\r\n%s\r\n" % (len(ITEM), ITEM)
    for _ in range(n // CLIENTS):
        for client in clients:
            client.send(request)
        _settle()
    return n // CLIENTS * CLIENTS


def _get(server: Server, n: int) -> int:
    _set(server, n)  # untimed fill
    return n


def _get_timed(server: Server, n: int) -> int:
    clients = [_Client(server, i) for i in range(CLIENTS)]
    for _ in range(n // CLIENTS):
        for client in clients:
            client.send(b"get bench\r\n")
        _settle()
    hit = b"VALUE bench 0 %d\r\n%s\r\nEND\r\n" % (len(ITEM), ITEM)
    if any(reply != hit for client in clients for reply in client.transport.replies):
        raise AssertionError("a GET of the filled queue missed or was corrupted")
    return n // CLIENTS * CLIENTS


def _blocking(server: Server, n: int) -> int:
    """many-clients without the churn: consumers park on an empty queue, a producer's SET
    wakes one, which confirms and parks again."""
    consumers = [_Client(server, i) for i in range(CLIENTS)]
    producer = _Client(server, CLIENTS)
    request = b"get bench/t=1000/close/open\r\n"
    for consumer in consumers:
        consumer.send(request)
    _settle()
    puts = b"set bench 0 0 %d\r\n%s\r\n" % (len(ITEM), ITEM) * 16
    done = 0
    while done < n:
        producer.send(puts)  # wakes the 16 consumers parked longest
        _settle()
        for consumer in consumers:
            if consumer.transport.replies:  # an item (or, rarely, the end of its wait)
                consumer.transport.replies.clear()
                consumer.send(request)
                done += 1
        _settle()
    return done + len(producer.transport.replies) * 16


def _churn(server: Server, n: int) -> int:
    """A connection's life: start, one blocking open read, hang-up."""
    for i in range(n // CLIENTS):
        clients = [_Client(server, i * CLIENTS + j) for j in range(CLIENTS)]
        for client in clients:
            client.send(b"get churn/t=1000/close/open\r\n")
        _settle()
        for client in clients:
            client.hang_up()
        _settle()
    return n // CLIENTS * CLIENTS


SCENARIOS: dict[str, tuple[Callable[[Server, int], int], Callable[[Server, int], int] | None, int]] = {
    # name: (timed part, untimed set-up, requests)
    "set": (_set, None, 50_000),
    "get": (_get_timed, _get, 50_000),
    "blocking": (_blocking, None, 20_000),
    "churn": (_churn, None, 10_000),
}


def measure(name: str, requests: int | None = None) -> float:
    """µs of CPU time per request for one run of scenario ``name`` on a fresh server."""
    timed, setup, n = SCENARIOS[name]
    n = requests or n
    with tempfile.TemporaryDirectory() as data_dir:
        config = ServerConfig(data_dir=data_dir)
        server = Server(config, opener=make_file_opener(data_dir, read_behind=True))
        if setup is not None:
            setup(server, n)
        started = time.process_time()
        count = timed(server, n)
        spent = time.process_time() - started
        server.collection.stop()
    return spent / count * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", action="append", choices=sorted(SCENARIOS))
    parser.add_argument("--requests", type=int, help="Requests per run (default: per scenario).")
    args = parser.parse_args(argv)
    configure_logging(level="warning")
    for name in args.only or SCENARIOS:
        runs = [measure(name, args.requests) for _ in range(args.rounds)]
        print(f"{name:9s} {min(runs):6.2f} µs/request (runs: {', '.join(f'{r:.2f}' for r in runs)})",
              flush=True)


if __name__ == "__main__":
    main()
