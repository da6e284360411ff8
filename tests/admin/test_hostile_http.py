"""HTTP clients that misbehave on the admin port never stall memcache clients, and cannot
hold the server's descriptors: half-sent requests and replies never read; a request that does
not parse is one log line."""

from __future__ import annotations

import json
import os
import select
import socket
import time

from kestrel_actors.admin import MAX_ARRIVING, REQUEST_DEADLINE, SEND_TIMEOUT

from ..helpers import PATIENCE, get_json, log_lines


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_half_requests_and_unread_replies_stall_neither_memcache_nor_the_descriptors(admin_server):
    client = admin_server.client()
    assert client.set("steady", b"before") == b"STORED"
    before = open_fds(admin_server.proc.pid)
    address = (admin_server.admin_host, admin_server.admin_port)
    host = b"Host: %s:%d\r\n" % (admin_server.admin_host.encode(), admin_server.admin_port)
    held = []
    try:
        for _ in range(MAX_ARRIVING + 40):  # more requests arriving than the admin port waits for
            sock = socket.create_connection(address)
            sock.sendall(b"GET /stats.json HTTP/1.1\r\n" + host)  # the blank line never comes
            held.append(sock)
        for _ in range(3):  # pipelined requests whose replies are never read
            sock = socket.create_connection(address)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall((b"GET /metrics HTTP/1.1\r\n" + host + b"\r\n") * 100)
            held.append(sock)
        time.sleep(0.5)
        # memcache clients are served all along
        for number in range(50):
            assert client.set("steady", b"%d" % number) == b"STORED"
            assert client.get("steady") is not None
        other = admin_server.client()
        assert other.get("steady") is not None
        other.close()
        # the oldest half requests gave way: the admin port holds at most MAX_ARRIVING of them
        assert open_fds(admin_server.proc.pid) <= before + MAX_ARRIVING + 3 + 4
        # the server closes what does not arrive within the deadline or takes nothing for
        # SEND_TIMEOUT, and serves again
        for sock in held[1:]:
            sock.close()
        held[0].settimeout(REQUEST_DEADLINE + 10)
        assert held[0].recv(100) == b""
        deadline = time.monotonic() + REQUEST_DEADLINE + SEND_TIMEOUT + 10
        while open_fds(admin_server.proc.pid) > before:
            assert time.monotonic() < deadline, "admin connections still held"
            time.sleep(0.2)
        assert get_json(admin_server.admin_url + "/ping") == {"response": "pong"}
    finally:
        for sock in held:
            sock.close()
    assert admin_server.proc.poll() is None
    assert "Traceback" not in admin_server.log()


PIPELINED = 100
"""Requests each admin connection pipelines in one send."""

STATUS_CHANGES = 2000
"""Status changes a memcache client pipelines, each behind a 1 ms blocking read: far more than
the admin connections' requests, so changes are still coming when the last reply is read."""


def _http_bodies(buffer: bytes) -> tuple[list[bytes], bytes]:
    """The bodies of the whole replies at the head of ``buffer``, and what is left."""
    bodies = []
    while (end := buffer.find(b"\r\n\r\n")) >= 0:
        head = buffer[:end].split(b"\r\n")
        assert head[0] == b"HTTP/1.1 200 OK", head[0]
        [length] = [int(line.split(b":", 1)[1]) for line in head[1:] if line.lower().startswith(b"content-length:")]
        if len(buffer) < end + 4 + length:
            break
        bodies.append(buffer[end + 4 : end + 4 + length])
        buffer = buffer[end + 4 + length :]
    return bodies, buffer


def test_pipelined_requests_leave_memcache_clients_their_turns(admin_server):
    """An answer never waits, so pipelined requests were answered back to back without the
    hub polling other sockets: three connections of 100 /metrics held a memcache client up
    for about 6 s. Now each admin request gives the hub a turn first, so a memcache client
    is served between one connection's pipelined requests. Seen in the server's own order,
    not on a clock: a memcache client pipelines status changes, one per 1 ms blocking read,
    and each connection's pipelined ``/server_info`` (which never waits itself) must report
    more than one status."""
    host = b"Host: %s:%d\r\n" % (admin_server.admin_host.encode(), admin_server.admin_port)
    changer = admin_server.client()
    changes = b"".join(b"get turns/t=1\r\nstatus %s\r\n" % (b"readonly" if n % 2 == 0 else b"up")
                       for n in range(STATUS_CHANGES))
    piped: dict[socket.socket, tuple[bytearray, list[bytes]]] = {}
    for _ in range(3):
        sock = socket.create_connection((admin_server.admin_host, admin_server.admin_port))
        piped[sock] = (bytearray(), [])  # what came and is not a whole reply yet; the bodies
    try:
        changer.send(changes)
        for sock in piped:
            sock.sendall((b"GET /server_info HTTP/1.1\r\n" + host + b"\r\n") * PIPELINED)
        while waiting := [sock for sock, (_, bodies) in piped.items() if len(bodies) < PIPELINED]:
            readable, _, _ = select.select([changer.sock, *waiting], [], [], PATIENCE)
            assert readable, "no reply within the patience"
            for sock in readable:
                data = sock.recv(1 << 20)
                assert data, "a connection closed"
                if sock is not changer.sock:  # the changer's replies are only read, so it goes on
                    rest, bodies = piped[sock]
                    whole, left = _http_bodies(bytes(rest) + data)
                    rest[:] = left
                    bodies.extend(whole)
    finally:
        for sock in piped:
            sock.close()
        changer.close()
    for number, (_, bodies) in enumerate(piped.values()):
        seen = [json.loads(body)["status"] for body in bodies]
        assert len(set(seen)) > 1, f"connection {number}: one status ({seen[0]}) in all its {PIPELINED} replies"


def test_more_than_100_headers_is_one_log_line_and_a_400(admin_server):
    """Issue 53.5: http.client refuses a 101st header, and gevent printed its 20-line traceback.
    150 headers: a 400, one JSON line saying why, and the next request is served."""
    assert get_json(admin_server.admin_url + "/ping") == {"response": "pong"}
    time.sleep(0.2)
    events_before, raw_before = log_lines(admin_server)
    headers = b"".join(b"X-Filler-%d: %d\r\n" % (number, number) for number in range(150))
    with socket.create_connection((admin_server.admin_host, admin_server.admin_port), timeout=10) as sock:
        sock.sendall(b"GET /shutdown HTTP/1.1\r\nHost: %s:%d\r\n%s\r\n" % (
            admin_server.admin_host.encode(), admin_server.admin_port, headers))
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 400 "), reply
    assert get_json(admin_server.admin_url + "/ping") == {"response": "pong"}
    time.sleep(0.2)
    events, raw = log_lines(admin_server)
    assert raw == raw_before, raw[len(raw_before):]  # nothing printed beside the JSON log
    [line] = events[len(events_before):]
    assert line["event"] == "bad admin request" and "100 headers" in line["error"], line
    assert admin_server.proc.poll() is None
