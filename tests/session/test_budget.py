"""The server-wide buffer budget (``session/_budget``) against real transports on a socket pair,
on this thread's hub: it sums what each connection holds, sheds the heaviest first, and lets
go of a connection once it has closed (it keeps every open one, for a shed to look through)."""

from __future__ import annotations

import socket

import gevent

from kestrel_actors.protocol import MemcacheDecoder
from kestrel_actors.session._budget import BufferBudget
from kestrel_actors.session._transport import SocketTransport
from kestrel_actors.stats import ServerStats

from ..helpers import PATIENCE, wait_for


def _connection(budget: BufferBudget, stats: ServerStats) -> tuple[SocketTransport, socket.socket]:
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    transport = SocketTransport(ours, MemcacheDecoder(), lambda _commands: None, lambda: None, stats, budget)
    transport.start()
    return transport, theirs


def _settled(check) -> bool:
    return wait_for(lambda: gevent.sleep(0.01) or check(), PATIENCE, 0.0)


def test_the_budget_sums_what_each_connection_holds_and_forgets_a_closed_one():
    budget, stats = BufferBudget(1 << 30), ServerStats()
    first, first_client = _connection(budget, stats)
    second, second_client = _connection(budget, stats)
    assert budget.members == {first, second} and budget.total == 0
    first_client.sendall(b"set q 0 0 1000\r\n" + bytes(300))  # half a request: the decoder holds it
    second_client.sendall(b"set q 0 0 1000\r\n" + bytes(500))
    assert _settled(lambda: first.held >= 300 and second.held >= 500)
    assert budget.total == first.held + second.held
    assert stats.bytes_read == 2 * len(b"set q 0 0 1000\r\n") + 800

    first.close()
    assert budget.members == {second} and budget.total == second.held
    second.close()
    assert budget.members == set() and budget.total == 0
    first_client.close()
    second_client.close()


def test_over_the_bound_the_heaviest_connections_go_first_until_the_sum_is_under_it():
    budget, stats = BufferBudget(2500), ServerStats()
    connections = [_connection(budget, stats) for _ in range(3)]
    for (_transport, client), size in zip(connections, (600, 1400, 900), strict=True):
        client.sendall(b"set q 0 0 5000\r\n" + bytes(size))
    (light, _), (heavy, _), (middle, _) = connections
    # 2,900 held against 2,500: shedding the heaviest (1,400) is enough
    assert _settled(lambda: budget.shed_connections == 1)
    assert heavy.closed and not light.closed and not middle.closed
    assert budget.members == {light, middle} and budget.total == light.held + middle.held <= 2500
    for transport, client in connections:
        transport.close()
        client.close()
