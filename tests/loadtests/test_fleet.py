"""The load generator's lean loop (``kestrel_actors.loadtests.fleet``): its reply parsing fed in
pieces, and the loop itself against a real server and against one that never answers."""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import threading

import pytest

from kestrel_actors.client import UnexpectedReply
from kestrel_actors.loadtests.fleet import LeanClient
from kestrel_actors.loadtests.report import EXIT_HARNESS
from kestrel_actors.loadtests.runner import ClientSpec, Options, Plan, run

from ..helpers import REPO

HIT = b"VALUE q 0 3\r\nabc\r\nEND\r\n"
END = b"END\r\n"


def pieces(data: bytes, size: int) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)]


@pytest.mark.parametrize("size", [1, 2, 3, 7, 100])
def test_a_fixed_reply_in_pieces_is_complete_only_with_its_last_byte(size):
    client = LeanClient()
    expected = b"STORED\r\n" * 3
    chunks = pieces(expected, size)
    assert [client.fixed(chunk, expected) for chunk in chunks] == [False] * (len(chunks) - 1) + [True]
    assert not client.buf
    assert client.fixed(expected, expected)  # the next reply, whole


@pytest.mark.parametrize("reply", [b"NOT_STORED\r\n", b"STORED\r\nSTORED\r\nSTORED\r\nX", b"STOR\r\n"])
def test_a_fixed_reply_with_other_bytes_is_an_unexpected_reply(reply):
    client = LeanClient()
    with pytest.raises(UnexpectedReply):
        for chunk in pieces(reply, 4):
            client.fixed(chunk, b"STORED\r\n" * 3)


@pytest.mark.parametrize("size", [1, 2, 5, 6, 13, 1000])
def test_get_replies_in_pieces_come_out_whole_once_all_have_come(size):
    client = LeanClient()
    data = HIT + END + HIT
    results = [client.get_replies(chunk, 3, len(HIT)) for chunk in pieces(data, size)]
    assert results[:-1] == [None] * (len(results) - 1)
    assert results[-1] == [HIT, None, HIT]
    assert not client.buf
    assert client.get_replies(END, 1, len(HIT)) == [None]
    assert client.get_replies(HIT, 1, len(HIT)) == [HIT]


@pytest.mark.parametrize("data", [b"ERROR\r\n", HIT + END + END, b"VALUX"])
def test_get_replies_other_than_value_or_end_or_too_many_are_unexpected(data):
    client = LeanClient()
    with pytest.raises(UnexpectedReply):
        client.get_replies(data, 2, len(HIT))


@pytest.mark.parametrize(("clients", "greenlets"), [(12, False), (12, True), (1, False)])
def test_the_lean_loop_drives_a_process_clients_at_once_unless_told_not_to(server, monkeypatch, clients,
                                                                           greenlets):
    """In-process, through the runner: 12 put-many clients (bursts of 1–3) go to one call of the
    lean loop, or, with ``--greenlets`` or a client alone, to none; either way every reply is
    checked and the queue then holds every item."""
    from kestrel_actors.loadtests import runner

    driven: list[int] = []
    real_drive = runner.drive

    def recording_drive(contexts, makes):
        driven.append(len(contexts))
        return real_drive(contexts, makes)

    monkeypatch.setattr(runner, "drive", recording_drive)
    specs = [ClientSpec("kestrel_actors.loadtests.scenarios.put_many:putter",
                        {"queue": "fleet", "count": 25, "size": 64, "rollup": r % 3 + 1})
             for r in range(clients)]
    result = run(Plan(specs, progress="put", target=25 * clients),
                 Options(port=server.port, greenlets=greenlets), epoch=0)
    assert not result.failures and not result.errors
    assert result.get("put").items == 25 * clients
    assert driven == ([] if greenlets or clients == 1 else [clients])
    client = server.client()
    assert client.stats()["queue_fleet_items"] == str(25 * clients)
    client.close()


def answering_server(answer: bytes | None, reset_after: int = 0) -> tuple[socket.socket, list[socket.socket]]:
    """A listener on a free port whose connections get ``answer`` for every read (None: nothing
    at all), and are reset after ``reset_after`` answers if that is not 0: not a queue server, a
    peer that misbehaves."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def serve(conn: socket.socket) -> None:
        answered = 0
        while True:
            try:
                data = conn.recv(65536)
            except OSError:
                return
            if not data:
                return
            if answer is not None:
                try:
                    conn.sendall(answer)
                except OSError:  # the client has gone (the run ended)
                    return
                answered += 1
            if reset_after and answered == reset_after:
                try:
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                except OSError:  # the test has closed it already, at its end
                    return
                conn.close()  # a reset, not an orderly close
                return

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(conn)
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return listener, accepted


def test_a_wrong_reply_fails_the_lean_loop_run():
    """A reply other than STORED is a failure of the run, named by the role, not a hang."""
    listener, accepted = answering_server(b"SERVER_ERROR not today\r\n")
    specs = [ClientSpec("kestrel_actors.loadtests.scenarios.put_many:putter",
                        {"queue": "q", "count": 3, "size": 16, "rollup": 1}) for _ in range(2)]
    try:
        result = run(Plan(specs, progress="put", target=6),
                     Options(port=listener.getsockname()[1], io_timeout=5), epoch=0)
    finally:
        listener.close()
        for conn in accepted:
            conn.close()
    assert not result.errors
    assert result.failures and result.failures[0].startswith("putter: expected b'STORED")


@pytest.mark.parametrize("greenlets", [False, True])
def test_a_server_that_resets_the_connection_fails_the_run_either_way(greenlets):
    """A connection reset after one STORED is the server's failure (exit 1), whichever call of
    the client meets it first, on the lean loop as on greenlets."""
    listener, accepted = answering_server(b"STORED\r\n", reset_after=1)
    specs = [ClientSpec("kestrel_actors.loadtests.scenarios.put_many:putter",
                        {"queue": "q", "count": 5, "size": 16, "rollup": 1}) for _ in range(3)]
    try:
        result = run(Plan(specs, progress="put", target=15),
                     Options(port=listener.getsockname()[1], io_timeout=5, greenlets=greenlets), epoch=0)
    finally:
        listener.close()
        for conn in accepted:
            conn.close()
    assert not result.errors, result.errors
    assert result.failures and result.failures[0].startswith("putter: ")


@pytest.mark.parametrize("loop", ["lean", "greenlets"])
def test_a_server_that_never_answers_ends_the_run_at_the_io_timeout(loop):
    """The --io-timeout watchdog stops the lean loop as it stops a client's greenlet: exit 3,
    "no reply … within", well before --timeout."""
    listener, accepted = answering_server(None)
    port = listener.getsockname()[1]
    command = [sys.executable, "-m", "kestrel_actors.loadtests", "put-many", "-p", str(port), "-F",
               "-c", "3", "-n", "30", "--no-progress", "--timeout", "50", "--io-timeout", "0.5"]
    if loop == "greenlets":
        command.append("--greenlets")
    try:
        proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=40)
    finally:
        listener.close()
        for conn in accepted:
            conn.close()
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == EXIT_HARNESS, proc.stdout + proc.stderr
    assert any("no reply from" in error and "within 0.5s" in error for error in record["errors"]), record


def test_a_value_shorter_than_a_hit_is_unexpected_as_soon_as_its_header_has_come():
    """Waiting for the rest of a hit that will never come would end in a timeout, not in the
    failure it is: the header's length tells at once."""
    client = LeanClient()
    assert client.get_replies(b"VALUE q 0 ", 1, len(HIT) + 10) is None  # the header not whole yet
    with pytest.raises(UnexpectedReply, match="not an item this run put"):
        client.get_replies(b"3\r\nabc", 1, len(HIT) + 10)
