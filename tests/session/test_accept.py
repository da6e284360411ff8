"""The listener's accept loop (``session._connections.accept_burst``) on a real listening socket:
it takes every client the kernel's backlog holds, and ends without the accept that would find
it empty when the kernel says how many wait (Linux's ``TCP_INFO``)."""

from __future__ import annotations

import _socket
import socket
import sys
import time

import pytest

from kestrel_actors.session._connections import accept_burst, backlog_length


class _Counting(_socket.socket):
    """A listening socket that counts its accepts (the C socket type the listener's is)."""

    accepts = 0

    def _accept(self):
        self.accepts += 1
        return super()._accept()


class _Silent(_Counting):
    """One whose kernel does not say how many clients wait."""

    def getsockopt(self, *args):
        raise OSError("not told")


def _listening(kind: type[_Counting]) -> _Counting:
    listening = kind(socket.AF_INET, socket.SOCK_STREAM)
    listening.bind(("127.0.0.1", 0))
    listening.listen(16)
    listening.setblocking(False)
    return listening


def _connect(listening: _Counting, count: int) -> list[socket.socket]:
    clients = [socket.create_connection(listening.getsockname()) for _ in range(count)]
    deadline = time.monotonic() + 10
    while backlog_length(listening) < count and time.monotonic() < deadline:
        time.sleep(0.01)  # a connection is in the accept backlog once its handshake is done
    return clients


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="TCP_INFO of a listener is Linux's")
def test_a_burst_takes_the_clients_waiting_and_ends_without_an_accept_that_would_block():
    listening = _listening(_Counting)
    clients = _connect(listening, 3)
    accepted: list = []
    try:
        assert backlog_length(listening) == 3
        accept_burst(listening, lambda sock, address, waiting: accepted.append(sock), 64, 1024, None)
        assert len(accepted) == 3
        assert listening.accepts == 3  # the backlog was known empty: no fourth, failing accept
        assert backlog_length(listening) == 0
    finally:
        for sock in accepted + clients + [listening]:
            sock.close()


def test_a_kernel_that_does_not_say_how_many_wait_is_accepted_from_until_it_would_block():
    listening = _listening(_Silent)
    clients = [socket.create_connection(listening.getsockname()) for _ in range(2)]
    accepted: list = []
    try:
        assert backlog_length(listening) == -1
        deadline = time.monotonic() + 10
        while len(accepted) < 2 and time.monotonic() < deadline:
            accept_burst(listening, lambda sock, address, waiting: accepted.append(sock), 64, 1024, None)
            time.sleep(0.01)
        assert len(accepted) == 2
        assert listening.accepts > 2  # each burst ended at the accept that found none
    finally:
        for sock in accepted + clients + [listening]:
            sock.close()


def test_a_burst_takes_no_more_than_its_limit_and_leaves_the_rest_waiting():
    listening = _listening(_Counting)
    clients = _connect(listening, 3)
    accepted: list = []
    try:
        accept_burst(listening, lambda sock, address, waiting: accepted.append(sock), 2, 1024, None)
        assert len(accepted) == 2
        accept_burst(listening, lambda sock, address, waiting: accepted.append(sock), 2, 1024, None)
        assert len(accepted) == 3
    finally:
        for sock in accepted + clients + [listening]:
            sock.close()
