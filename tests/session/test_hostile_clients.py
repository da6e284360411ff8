"""Clients that hang up at the worst moment, never read, or outnumber the file descriptors
(issue 17, cases 1, 2, 8 and 10), against a real server process.
"""

from __future__ import annotations

import json
import socket
import sys
import time

import pytest

from ..helpers import PATIENCE, Client, ServerProcess, fill, stats_of, unique, value, wait_for


def rss_bytes(server: ServerProcess) -> int:
    """The server process's resident set, from ``/proc/<pid>/status``."""
    with open(f"/proc/{server.proc.pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def wait_stat(server: ServerProcess, name: str, expected: str, timeout: float = PATIENCE) -> None:
    ok = wait_for(lambda: stats_of(server).get(name) == expected, timeout, 0.05)
    assert ok, f"{name} = {stats_of(server).get(name)!r}, wanted {expected!r}"


def raw_client(server: ServerProcess, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket()
    if rcvbuf is not None:  # before connecting, so that the window is small from the start
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect((server.host, server.port))
    return sock


def read_exactly(sock: socket.socket, size: int) -> bytes:
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:])
        if not n:
            raise AssertionError(f"closed after {got} of {size} bytes")
        got += n
    return bytes(buffer)


# -- case 1: a hang-up while reading is paused ------------------------------------------------


BACKLOGS = {
    "5000 commands behind the wait": b"version\r\n" * 5000,
    "an error that closes behind the wait": b"bogus\r\n",
    "both": b"version\r\n" * 5000 + b"bogus\r\n",
}


@pytest.mark.parametrize("behind", list(BACKLOGS.values()), ids=list(BACKLOGS))
def test_hang_up_behind_a_backlog_cancels_the_parked_get(server, behind):
    queue = unique("lost")
    waiter = server.client()
    waiter.send(b"get %s/t=60000\r\n" % queue.encode() + behind)
    wait_stat(server, f"queue_{queue}_waiters", "1")
    waiter.close()
    writer = server.client()
    assert writer.call(b"set %s 0 0 8\r\nprecious" % queue.encode()) == b"STORED"
    reader = server.client()
    assert reader.get(queue) == b"precious"  # not swallowed by the client that hung up
    writer.close()
    reader.close()
    wait_stat(server, f"queue_{queue}_waiters", "0")
    wait_stat(server, "curr_connections", "1")  # the stats client only


def test_hang_up_of_a_client_whose_output_is_backed_up_is_seen(server):
    """Reading also pauses while replies pile up; the close must still end the session."""
    queue = unique("big")
    fill(server.client(), queue, b"x" * (1 << 20))
    hog = raw_client(server, rcvbuf=4096)
    hog.sendall(b"get %s/peek\r\n" % queue.encode() * 50 + b"get %s/t=60000/open\r\n" % unique("w").encode())
    time.sleep(0.5)
    hog.close()
    wait_stat(server, "curr_connections", "1")


def test_many_parked_hang_ups_in_a_loop_lose_nothing(server):
    queue = unique("loop")
    for round_ in range(20):
        waiter = server.client()
        waiter.send(b"get %s/t=60000\r\n" % queue.encode() + b"version\r\n" * 5000)
        wait_stat(server, f"queue_{queue}_waiters", "1")
        waiter.close()
        writer = server.client()
        data = b"item%04d" % round_
        assert writer.call(b"set %s 0 0 8\r\n%s" % (queue.encode(), data)) == b"STORED"
        assert writer.get(queue) == data
        writer.close()


# -- case 2: output memory per connection is bounded ------------------------------------------


BIG = bytes(range(256)) * 4096  # 1 MiB, every byte value


PEEKS = 600
"""Enough for 600 MiB of replies per connection (the whole lot, built at once, before the
fix); few enough to read back through a 4 KiB window in seconds."""


def test_pipelined_peeks_never_read_keep_memory_bounded(server):
    queue = unique("big")
    fill(server.client(), queue, BIG)
    base = rss_bytes(server)
    hogs = [raw_client(server, rcvbuf=4096) for _ in range(3)]
    for hog in hogs:
        hog.sendall(b"get %s/peek\r\n" % queue.encode() * PEEKS)
    time.sleep(2.0)
    peak = rss_bytes(server)
    other = server.client()  # still served while the hogs hold their replies
    other_queue = unique("other")
    assert other.call(b"set %s 0 0 2\r\nok" % other_queue.encode()) == b"STORED"
    assert other.get(other_queue) == b"ok"
    for _ in range(10):
        time.sleep(0.2)
        peak = max(peak, rss_bytes(server))
    assert peak < base + 64 * 1024 * 1024, (base, peak)
    expected = value(queue, BIG)
    for hog in hogs[1:]:
        hog.close()
    hogs[0].settimeout(20)
    for _ in range(PEEKS):
        assert read_exactly(hogs[0], len(expected)) == expected
    hogs[0].close()


def test_five_clients_pipelining_5000_peeks_never_read_keep_memory_bounded(server):
    """The issue's own recipe: 5,000 peeks of a 1 MiB item (70 KB of requests) on each of five
    connections with a 4 KiB receive buffer, never read (5 GiB of replies per connection if
    they were built at once). Others are still answered while the five hold their replies."""
    fill(server.client(), "big", BIG)
    base = rss_bytes(server)
    hogs = [raw_client(server, rcvbuf=4096) for _ in range(5)]
    for hog in hogs:
        hog.sendall(b"get big/peek\r\n" * 5000)
    time.sleep(1.0)
    peak = rss_bytes(server)
    for _ in range(5):
        other = server.client()
        other_queue = unique("other")
        assert other.call(b"set %s 0 0 2\r\nok" % other_queue.encode()) == b"STORED"
        assert other.get(other_queue) == b"ok"
        other.close()
        time.sleep(0.2)
        peak = max(peak, rss_bytes(server))
    assert peak < base + 5 * 8 * 1024 * 1024, (base, peak)  # about 3 MiB plus one item each
    for hog in hogs:
        hog.close()
    wait_stat(server, "curr_connections", "1")


def test_a_monitor_never_read_keeps_memory_bounded(server):
    queue = unique("mon")
    items = [bytes([n]) * (1 << 20) for n in range(200)]
    writer = server.client(timeout=30)
    for item in items:
        fill(writer, queue, item)
    base = rss_bytes(server)
    hog = raw_client(server, rcvbuf=4096)
    hog.sendall(b"monitor %s 30 200\r\n" % queue.encode())
    time.sleep(2.0)
    peak = rss_bytes(server)
    assert writer.call(b"version").startswith(b"VERSION")
    for _ in range(5):
        time.sleep(0.2)
        peak = max(peak, rss_bytes(server))
    assert peak < base + 64 * 1024 * 1024, (base, peak)
    hog.settimeout(20)
    for item in items:
        assert read_exactly(hog, len(value(queue, item))) == value(queue, item)
    assert read_exactly(hog, 5) == b"END\r\n"
    hog.sendall(b"confirm %s 200\r\n" % queue.encode())
    assert read_exactly(hog, 5) == b"END\r\n"
    hog.close()


def test_pipelined_gets_of_large_items_arrive_whole_and_in_order(server):
    queue = unique("gets")
    items = [bytes([n]) * (300 * 1024 + n) for n in range(40)]
    writer = server.client(timeout=30)
    for item in items:
        fill(writer, queue, item)
    client = raw_client(server, rcvbuf=4096)
    client.sendall(b"get %s\r\n" % queue.encode() * 41 + b"version\r\n")
    time.sleep(0.5)
    client.settimeout(20)
    for item in items:
        assert read_exactly(client, len(value(queue, item))) == value(queue, item)
    assert read_exactly(client, 5) == b"END\r\n"
    assert read_exactly(client, 8) == b"VERSION "
    client.close()


# -- case 8: out of file descriptors ----------------------------------------------------------


class LimitedServer(ServerProcess):
    """A server started with these open-file limits; by default the hard limit is as low as
    the soft one, so raising the soft one is no help."""

    soft = hard = 64

    def command(self) -> list[str]:
        launcher = (
            "import resource, runpy, sys; "
            f"resource.setrlimit(resource.RLIMIT_NOFILE, ({self.soft}, {self.hard})); "
            "sys.argv = ['kestrel-actors'] + sys.argv[1:]; "
            "runpy.run_module('kestrel_actors.cli', run_name='__main__')"
        )
        return [sys.executable, "-c", launcher, *super().command()[3:]]


def _version_or_closed(client: Client) -> str:
    try:
        client.send(b"version\r\n")
        line = client.read_line()
    except (ConnectionError, OSError):
        return "closed"
    return "served" if line.startswith(b"VERSION") else f"other {line!r}"


def _connections(server: ServerProcess) -> str | None:
    """``curr_connections``, or None while this client too is refused."""
    try:
        return stats_of(server)["curr_connections"]
    except (ConnectionError, OSError):
        return None


def test_out_of_file_descriptors_refuses_cleanly_and_recovers(tmp_path):
    server = LimitedServer(tmp_path / "data").start()
    try:
        clients = [Client(server.host, server.port, timeout=PATIENCE) for _ in range(150)]
        outcomes = [_version_or_closed(client) for client in clients]
        assert set(outcomes) <= {"served", "closed"}, outcomes
        assert outcomes.count("served") >= 20
        assert outcomes.count("closed") >= 50  # refused at once, not left hanging
        for client in clients:
            client.close()
        assert wait_for(lambda: _connections(server) == "1")
        later = [Client(server.host, server.port) for _ in range(20)]
        assert [_version_or_closed(client) for client in later] == ["served"] * 20
        log = server.log_path.read_text()
        assert "Traceback" not in log and "Too many open files" not in log.replace(
            '"error": "Too many open files"', "")
        refusals = [json.loads(line) for line in log.splitlines() if "refused: out of file descriptors" in line]
        assert 1 <= len(refusals) <= 3, refusals
    finally:
        server.stop()


class LowSoftLimitServer(LimitedServer):
    """Started with a soft limit below the hard one (as a shell's 1024 under a higher hard limit)."""

    soft, hard = 64, 400


def test_the_soft_open_file_limit_is_raised_to_the_hard_limit(tmp_path):
    server = LowSoftLimitServer(tmp_path / "data").start()
    try:
        clients = [Client(server.host, server.port, timeout=PATIENCE) for _ in range(150)]  # > 64
        assert [_version_or_closed(client) for client in clients] == ["served"] * 150
        assert wait_for(lambda: _connections(server) == "151")  # the start-up probes' hang-ups counted too
        for client in clients:
            client.close()
        with open(f"/proc/{server.proc.pid}/limits") as limits:
            [line] = [line for line in limits if line.startswith("Max open files")]
        assert line.split()[3:5] == ["400", "400"], line
        [listening] = [json.loads(line) for line in server.log_path.read_text().splitlines()
                       if '"memcache"' in line and '"listening"' in line]
        assert listening["open_file_limit"] == 400
        assert "refused: out of file descriptors" not in server.log_path.read_text()
    finally:
        server.stop()


# -- case 10: closes seen at once --------------------------------------------------------------


def test_idle_clients_that_close_are_counted_out_every_time(server):
    for _ in range(30):
        clients = [server.client() for _ in range(3)]
        for client in clients:
            assert client.call(b"version").startswith(b"VERSION")
        for client in clients:
            client.close()
        wait_stat(server, "curr_connections", "1")


# -- a handler that raises ---------------------------------------------------------------------


def test_a_failing_handler_closes_its_connection_and_the_next_client_is_served(make_server, tmp_path):
    """STATS over a queue whose name is outside Latin-1 raised in the session's handler (issue
    17 case 5) and left the client waiting for ever. Whether STATS answers or the connection
    closes, the client must not hang; if the handler failed, that is logged."""
    config = tmp_path / "kestrel.toml"
    config.write_text('[queues."jobs+\u6f22"]\n', encoding="utf-8")
    server = make_server("--config", str(config))
    for _ in range(3):
        client = server.client()
        client.send(b"stats\r\n")
        answered = False
        try:
            while client.read_line() != b"END":
                pass
            answered = True
        except ConnectionError:
            pass  # closed: the handler failed, and the client is told so by the close
        client.close()
        assert server.client().call(b"version").startswith(b"VERSION")
    if not answered:
        assert "connection handler failed" in server.log()


def test_pipelined_close_open_reads_answered_in_parts_confirm_each_item_once(server):
    """A queue answering in parts may stop between a read's confirm and its fetch: the rest
    of that read comes in the next part, and every item is delivered and confirmed once."""
    queue = unique("parts")
    items = [bytes([n]) * (400 * 1024) for n in range(30)]
    writer = server.client(timeout=30)
    for item in items:
        fill(writer, queue, item)
    client = raw_client(server, rcvbuf=4096)
    client.sendall(b"get %s/close/open\r\n" % queue.encode() * 31 + b"get %s/close\r\n" % queue.encode())
    time.sleep(0.5)
    client.settimeout(20)
    for item in items:
        assert read_exactly(client, len(value(queue, item))) == value(queue, item)
    assert read_exactly(client, 10) == b"END\r\nEND\r\n"
    stats = stats_of(server)
    assert (stats[f"queue_{queue}_items"], stats[f"queue_{queue}_open_transactions"]) == ("0", "0")
    client.close()
