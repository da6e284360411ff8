"""The socket transport (``session/_transport``) on a real socket pair, on this thread's hub: it
reads and writes through the socket's descriptor number, so once closed it must not touch that
number again (the kernel hands it to the next socket opened)."""

from __future__ import annotations

import socket

import gevent
import pytest

from kestrel_actors.protocol import MemcacheDecoder
from kestrel_actors.session._budget import BufferBudget
from kestrel_actors.session._transport import BACKLOG_COMMANDS, SocketTransport
from kestrel_actors.stats import ServerStats

from ..helpers import PATIENCE, wait_for


def _connection(commands: list) -> tuple[SocketTransport, socket.socket]:
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    transport = SocketTransport(ours, MemcacheDecoder(), commands.extend, lambda: None, ServerStats(),
                                BufferBudget(1 << 30))
    transport.start()
    return transport, theirs


def test_requests_in_and_replies_out_through_the_descriptor():
    commands: list = []
    transport, client = _connection(commands)
    try:
        client.sendall(b"get q\r\n")
        assert wait_for(lambda: gevent.sleep(0.01) or commands, PATIENCE, 0.0)
        assert [command.queue for command in commands] == ["q"]
        transport.sendall(b"END\r\n")
        client.settimeout(PATIENCE)
        assert client.recv(16) == b"END\r\n"
    finally:
        transport.close()
        client.close()


def test_a_closed_transport_never_writes_to_the_socket_that_reuses_its_descriptor_number():
    transport, client = _connection([])
    number = transport.fd
    transport.close()
    client.close()
    # the kernel gives out the lowest free number: new socket pairs soon take the released one
    opened: list[socket.socket] = []
    try:
        while number not in [sock.fileno() for sock in opened] and len(opened) < 64:
            opened.extend(socket.socketpair())
        assert number in [sock.fileno() for sock in opened]
        with pytest.raises(OSError):
            transport.sendall(b"VALUE q 0 6\r\nsecret\r\nEND\r\n")
        for sock in opened:
            sock.setblocking(False)
            with pytest.raises(BlockingIOError):
                sock.recv(64)  # nothing reached any of the new sockets
    finally:
        for sock in opened:
            sock.close()


def test_a_paused_connection_whose_unread_input_does_not_grow_is_closed_as_idle():
    """Unread input counts as sent only when there is more of it than the idle check last saw:
    a client whose requests wait unread while reading is paused (here: a backlog the session
    never works off), and that sends nothing more, is still closed after the idle timeout."""
    commands: list = []
    hung_up: list = []
    ours, client = socket.socketpair()
    ours.setblocking(False)
    transport = SocketTransport(ours, MemcacheDecoder(), commands.extend, lambda: hung_up.append(True),
                                ServerStats(), BufferBudget(1 << 30), idle_timeout=0.2)
    transport.start()
    try:
        backlog = BACKLOG_COMMANDS + 1
        client.sendall(b"get q\r\n" * backlog)  # one read: past the backlog, reading pauses
        assert wait_for(lambda: gevent.sleep(0.01) or len(commands) >= backlog, PATIENCE, 0.0)
        client.sendall(b"get q\r\n")  # waits unread from now on
        assert wait_for(lambda: gevent.sleep(0.01) or hung_up, PATIENCE, 0.0)
        assert len(commands) == backlog  # the last request was never read
    finally:
        transport.close()
        client.close()
