"""HTTP clients that misbehave on the admin port never stall memcache clients, and cannot
hold the server's descriptors: half-sent requests and replies never read."""

from __future__ import annotations

import os
import socket
import time

from kestrel_actors.admin import IDLE_TIMEOUT, MAX_CONNECTIONS

from ..helpers import get_json


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_half_requests_and_unread_replies_stall_neither_memcache_nor_the_descriptors(admin_server):
    client = admin_server.client()
    assert client.set("steady", b"before") == b"STORED"
    before = open_fds(admin_server.proc.pid)
    held = []
    try:
        for _ in range(MAX_CONNECTIONS + 40):  # more than the admin port serves at once
            sock = socket.create_connection((admin_server.host, admin_server.admin_port))
            sock.sendall(b"GET /stats.json HTTP/1.1\r\nHost: x\r\n")  # the blank line never comes
            held.append(sock)
        for _ in range(3):  # pipelined requests whose replies are never read
            sock = socket.create_connection((admin_server.host, admin_server.admin_port))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 100)
            held.append(sock)
        time.sleep(0.5)
        # memcache clients are served all along
        for number in range(50):
            assert client.set("steady", b"%d" % number) == b"STORED"
            assert client.get("steady") is not None
        other = admin_server.client()
        assert other.get("steady") is not None
        other.close()
        # the admin connections beyond MAX_CONNECTIONS wait in the backlog, not in our fd table
        assert open_fds(admin_server.proc.pid) <= before + MAX_CONNECTIONS + 4
        # the server closes what sends or takes nothing for IDLE_TIMEOUT, and serves again
        for sock in held[1:]:
            sock.close()
        held[0].settimeout(IDLE_TIMEOUT + 10)
        assert held[0].recv(100) == b""
        deadline = time.monotonic() + IDLE_TIMEOUT + 10
        while open_fds(admin_server.proc.pid) > before:
            assert time.monotonic() < deadline, "admin connections still held"
            time.sleep(0.2)
        assert get_json(admin_server.admin_url + "/ping") == {"response": "pong"}
    finally:
        for sock in held:
            sock.close()
    assert admin_server.proc.poll() is None
    assert "Traceback" not in admin_server.log()
