"""Checkpoints (behaviour §6.8): after a SIGKILL a queue restarts from its checkpoint and replays
only the journal written after it, to exactly the items, in the order, a full replay gives;
a damaged, stale or half-written checkpoint is a full replay (issue 56, point 3)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import time

from kestrel_actors.journal import Item, encode_add

from ..helpers import (
    Pipeline,
    ServerProcess,
    assert_numbered,
    drain_pipelined,
    number_of,
    numbered,
    stat,
    wait_for,
    write_config,
)

CONFIG = '[queues.q]\nmax_memory_size = "64KiB"\n'
"""Rotations (and so checkpoints) every 64 KiB of journal, and read-behind past 64 KiB."""


def _line(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=60)


def _ask(sock: socket.socket, command: bytes, end: bytes = b"\r\n") -> bytes:
    sock.sendall(command)
    data = b""
    while not data.endswith((b"END\r\n", b"STORED\r\n", b"ERROR\r\n")):
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    return data


def _set(sock: socket.socket, i: int, expiry: int = 0) -> None:
    data = numbered(i, 100)
    assert _ask(sock, b"set q 0 %d %d\r\n%s\r\n" % (expiry, len(data), data)) == b"STORED\r\n"


def _drain(server: ServerProcess) -> list[bytes]:
    """Every item of ``q`` still there (the expired ones are dropped as the GETs reach them)."""
    client = server.client()
    count = stat(client, "q", "items")
    client.close()
    pipe = Pipeline(server.host, server.port)
    values = pipe.get_all("q", count + 1)
    pipe.close()
    return [value for value in values if value is not None]


def _checkpoint_of_current_file(data_dir, queue: str) -> bool:
    """Whether the queue's checkpoint names its current file (the one of its last rotation is
    written by a greenlet of its own, after the answers: a test waits for it before a SIGKILL)."""
    try:
        state = json.loads((data_dir / ".checkpoint" / queue).read_bytes().split(b"\n")[1])
        return state["files"][-1][1] == os.stat(data_dir / queue).st_ino
    except (OSError, ValueError, IndexError, KeyError):
        return False


def _replays(server: ServerProcess, queue: str) -> list[dict]:
    return [e for e in server.log_events() if e.get("event") == "replayed journal" and e.get("queue") == queue]


def _workload(server: ServerProcess, checkpoint_copy) -> list[socket.socket]:
    """Adds, removes, reads opened, aborted and confirmed, items that expire, across several
    rotations; a copy of the checkpoint is taken part way. Answers the connections holding
    reads still open."""
    sock = _line(server.port)
    for i in range(1500):
        _set(sock, i, expiry=1 if i % 97 == 5 else 0)  # a few expire a second after they are added
    for _ in range(300):
        assert _ask(sock, b"get q\r\n").startswith(b"VALUE q ")
    opened = []
    for _ in range(4):
        reader = _line(server.port)
        assert _ask(reader, b"get q/open\r\n").startswith(b"VALUE q ")
        opened.append(reader)
    assert _ask(opened[0], b"get q/abort\r\n") == b"END\r\n"  # back at the head
    assert _ask(opened[1], b"get q/close\r\n") == b"END\r\n"  # confirmed: gone
    checkpoint_copy()
    for i in range(1500, 3000):
        _set(sock, i)
    for _ in range(200):
        assert _ask(sock, b"get q\r\n").startswith(b"VALUE q ")
    for i in range(3000, 3100):  # after the last rotation: the tail a restart replays
        _set(sock, i)
    sock.close()
    return opened[2:]


def _compare_with_full_replay(tmp_path, data_dir, config) -> tuple[list[dict], list[dict]]:
    """Restart ``data_dir`` from its checkpoint and a copy of it without one, drain both and
    compare; answers the "replayed journal" log lines of each."""
    full_dir = tmp_path / "full"
    shutil.copytree(data_dir, full_dir)
    shutil.rmtree(full_dir / ".checkpoint", ignore_errors=True)
    time.sleep(1.1)  # the items given an expiry of a second have expired for both
    results = []
    for directory in (data_dir, full_dir):
        server = ServerProcess(directory, ("--config", config)).start(timeout=120)
        try:
            results.append((_drain(server), _replays(server, "q")))
        finally:
            server.stop()
    (values, replays), (full_values, full_replays) = results
    assert values == full_values and len(values) > 2000
    assert full_replays[-1]["from_checkpoint"] is False
    return replays, full_replays


def test_restart_from_checkpoint_gives_what_a_full_replay_gives(tmp_path):
    data_dir = tmp_path / "data"
    config = write_config(tmp_path, CONFIG)
    server = ServerProcess(data_dir, ("--config", config)).start()
    try:
        held = _workload(server, lambda: None)
        assert wait_for(lambda: _checkpoint_of_current_file(data_dir, "q"), timeout=60)
        server.kill()
    finally:
        server.stop()
    for sock in held:
        sock.close()
    replays, full = _compare_with_full_replay(tmp_path, data_dir, config)
    assert replays[-1]["from_checkpoint"] is True
    assert replays[-1]["replayed_bytes"] < full[-1]["replayed_bytes"] // 4
    assert replays[-1]["open"] == full[-1]["open"] == 2


def test_an_older_checkpoint_replays_the_rotations_after_it(tmp_path):
    """A crash after rotations whose checkpoints were not written: the older checkpoint still
    matches its files (found by inode under their new names) and the rest is replayed."""
    data_dir = tmp_path / "data"
    config = write_config(tmp_path, CONFIG)
    saved = tmp_path / "older-checkpoint"
    server = ServerProcess(data_dir, ("--config", config)).start()
    try:
        held = _workload(server, lambda: wait_for((data_dir / ".checkpoint" / "q").exists, timeout=60)
                         and shutil.copy(data_dir / ".checkpoint" / "q", saved))
        server.kill()
    finally:
        server.stop()
    for sock in held:
        sock.close()
    shutil.copy(saved, data_dir / ".checkpoint" / "q")
    replays, full = _compare_with_full_replay(tmp_path, data_dir, config)
    assert replays[-1]["from_checkpoint"] is True
    assert full[-1]["replayed_bytes"] > replays[-1]["replayed_bytes"] > 64 * 1024  # rotated files too


def test_a_damaged_checkpoint_is_a_full_replay(tmp_path):
    data_dir = tmp_path / "data"
    config = write_config(tmp_path, CONFIG)
    server = ServerProcess(data_dir, ("--config", config)).start()
    try:
        held = _workload(server, lambda: None)
        server.kill()
    finally:
        server.stop()
    for sock in held:
        sock.close()
    path = data_dir / ".checkpoint" / "q"
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    path.write_bytes(bytes(raw))
    replays, _full = _compare_with_full_replay(tmp_path, data_dir, config)
    assert replays[-1]["from_checkpoint"] is False
    assert "damaged checkpoint" in "".join(p.read_text() for p in tmp_path.glob("server-*.log"))


def test_a_checkpoint_cut_short_before_its_rename_is_never_used(tmp_path):
    """SIGKILL between writing the temporary checkpoint and renaming it: the temporary file is
    deleted and the checkpoint in place (the previous one) is used."""
    data_dir = tmp_path / "data"
    config = write_config(tmp_path, CONFIG)
    server = ServerProcess(data_dir, ("--config", config)).start()
    try:
        held = _workload(server, lambda: None)
        server.kill()
    finally:
        server.stop()
    for sock in held:
        sock.close()
    whole = (data_dir / ".checkpoint" / "q").read_bytes()
    (data_dir / ".checkpoint" / "q~~tmp").write_bytes(whole[: len(whole) // 2])
    replays, _full = _compare_with_full_replay(tmp_path, data_dir, config)
    assert replays[-1]["from_checkpoint"] is True
    assert not (data_dir / ".checkpoint" / "q~~tmp").exists()


BIG = 200_000


def test_a_big_backlog_serves_its_head_after_replaying_only_the_tail(tmp_path):
    """200,000 items; a SET rotates the journal and writes a checkpoint; SIGKILL; the restart
    reads only what follows the checkpoint and the head comes from the old journal by
    read-behind, the rest of the queue intact and in order."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    now = int(time.time() * 1000)
    with open(data_dir / "big", "wb") as journal:
        for start in range(0, BIG, 20_000):
            journal.write(b"".join(encode_add(Item(numbered(i, 100), now)) for i in range(start, start + 20_000)))
    journal_bytes = (data_dir / "big").stat().st_size
    config = write_config(tmp_path, '[queues.big]\nmax_memory_size = "4MiB"\n')
    server = ServerProcess(data_dir, ("--config", config)).start(timeout=300)
    try:
        sock = _line(server.port)
        data = numbered(BIG, 100)
        assert _ask(sock, b"set big 0 0 %d\r\n%s\r\n" % (len(data), data)) == b"STORED\r\n"
        sock.close()
        # written by a greenlet of its own after the rotation, not before the answer
        assert wait_for(lambda: _checkpoint_of_current_file(data_dir, "big"), timeout=60)
        server.kill()
        server.start(timeout=120, loaded=False)
        sock = _line(server.port)
        head = _ask(sock, b"get big/peek\r\n")
        assert number_of(head[len(b"VALUE big 0 100\r\n"):]) == 0
        sock.close()
        replay = _replays(server, "big")[-1]
        assert replay["from_checkpoint"] is True and replay["items"] == BIG + 1
        assert replay["replayed_bytes"] < journal_bytes // 1000  # the SET's record, not the backlog
        assert_numbered(drain_pipelined(server, "big"), range(BIG + 1), size=100)
    finally:
        server.stop()
