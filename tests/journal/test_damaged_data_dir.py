"""Damaged and strange data directories, against a real server process (issue 17, cases 4-7).

Start-up never stops and never hangs for what it finds in the data directory: file names that
are not UTF-8, names outside Latin-1, named pipes, sockets and directories where journal files
could be, and journals damaged in the middle. Queue names are their bytes in every reply.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import time

import pytest

from kestrel_actors.journal._format import OP_ADDX, read_file_records
from kestrel_actors.journal._repair import SAVE_LIMIT

from ..helpers import Client, ServerProcess, free_port

pytestmark = pytest.mark.timeout(90)

NOW_MS = int(time.time() * 1000)


def addx(data: bytes, add_time: int = NOW_MS) -> bytes:
    return struct.pack("<biqq", OP_ADDX, len(data) + 16, add_time, 0) + data


def log_events(server: ServerProcess) -> list[dict]:
    events = []
    for line in server.log_path.read_bytes().splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            pass
    return events


def raw_reply(client: Client, command: bytes) -> bytes:
    """The whole reply to ``command`` up to its final ``END``."""
    client.send(command + b"\r\n")
    while not client.buffer.endswith(b"END\r\n"):
        if not client._fill():
            raise AssertionError(f"closed; buffered {client.buffer!r}")
    data, client.buffer = client.buffer, b""
    return data


def get_raw(client: Client, name: bytes) -> bytes | None:
    client.send(b"get " + name + b"\r\n")
    return client.read_value()


def set_raw(client: Client, name: bytes, data: bytes) -> bytes:
    client.send(b"set %s 0 0 %d\r\n%s\r\n" % (name, len(data), data))
    return client.read_line()


# -- case 4: any bytes in a file name ----------------------------------------------------------

def test_file_names_that_are_not_utf8_do_not_stop_start_up(tmp_path, started):
    data = tmp_path / "data"
    data.mkdir()
    raw = os.fsencode(data)
    with open(os.path.join(raw, b"caf\xe9"), "wb") as file:  # a queue: its name is these bytes
        file.write(addx(b"latin-1 named"))
    with open(os.path.join(raw, b"\xff\xfe.7"), "wb") as file:  # an archive of queue b"\xff\xfe"
        file.write(addx(b"kept"))
    with open(os.path.join(raw, b"\xff.bogus"), "wb"):
        pass
    with open(os.path.join(raw, b"ctl\x01name"), "wb") as file:  # not a legal name: left alone
        file.write(addx(b"never read"))
    with open(os.path.join(raw, b"x" * 230), "wb") as file:  # too long to be a queue name
        file.write(addx(b"never read"))
    server = started(data)
    c = server.client()
    assert get_raw(c, b"caf\xe9") == b"latin-1 named"
    assert get_raw(c, b"\xff\xfe") == b"kept"
    stats = raw_reply(c, b"stats")
    assert b"STAT queue_caf\xe9_total_items 1\r\n" in stats
    assert b"STAT queue_\xff\xfe_items 0\r\n" in stats
    assert set_raw(c, b"caf\xe9", b"again") == b"STORED"
    assert os.path.exists(os.path.join(raw, b"ctl\x01name")) and os.path.exists(os.path.join(raw, b"x" * 230))
    warnings = [e for e in log_events(server) if e.get("event") == "skipping journal with an illegal queue name"]
    assert len(warnings) == 2
    # the name a client sends is the file's name: after a restart the item is still there
    server.restart()
    assert get_raw(server.client(), b"caf\xe9") == b"again"


# -- case 5: names outside Latin-1 in every reply ------------------------------------------------

CONFIG_5 = """
[queues."jobs+漢"]
max_items = 100

[aliases]
"al漢" = ["jobs", "d漢"]
"""


def test_names_outside_latin1_from_config_alias_and_data_dir_in_every_reply(tmp_path, started):
    data = tmp_path / "data"
    data.mkdir()
    (data / "d漢").write_bytes(addx(b"from disk"))
    config = tmp_path / "k.toml"
    config.write_text(CONFIG_5, encoding="utf-8")
    text_port = free_port()
    server = started(data, "--config", str(config), "--text-port", str(text_port))
    c = server.client()
    child, alias, on_disk = "jobs+漢".encode(), "al漢".encode(), "d漢".encode()

    stats = raw_reply(c, b"stats")
    assert b"STAT queue_" + child + b"_items 0\r\n" in stats
    assert b"STAT queue_" + on_disk + b"_items 1\r\n" in stats
    assert b"STAT queue_" + alias + b"_children jobs," + on_disk + b"\r\n" in stats

    assert set_raw(c, alias, b"via alias") == b"STORED"  # to jobs (and so to jobs+漢) and to d漢
    assert get_raw(c, child) == b"via alias"
    assert get_raw(c, on_disk) == b"from disk"

    dump = raw_reply(c, b"dump_stats")
    assert b"queue '" + child + b"' {\r\n" in dump and b"queue '" + on_disk + b"' {\r\n" in dump
    assert b"queue '" + alias + b"' {\r\n" in dump
    named = raw_reply(c, b"dump_stats " + on_disk)
    assert named.startswith(b"queue '" + on_disk + b"' {\r\n  items=1\r\n")
    config_dump = raw_reply(c, b"dump_config")
    assert b"queue '" + child + b"' {\r\n" in config_dump and b"alias '" + alias + b"' {\r\n" in config_dump

    # the text protocol reads the same name from the same bytes
    with socket.create_connection((server.host, text_port), timeout=5) as text:
        text.sendall(b"get " + on_disk + b"\n")
        assert text.recv(100) == b":via alias\n"
        text.sendall(b"status\n")
        assert text.recv(100) == b":UP\n"
    # every client is still answered
    assert raw_reply(server.client(), b"stats").endswith(b"END\r\n")


# -- case 6: damage in the middle of a journal ---------------------------------------------------

def _events(server: ServerProcess, event: str) -> list[dict]:
    return [e for e in log_events(server) if e.get("event", "").startswith(event)]


def test_a_damaged_size_in_the_middle_keeps_the_items_after_it(tmp_path, started):
    data = tmp_path / "data"
    server = started(data)
    c = server.client()
    items = [b"%02d:" % i + bytes([65 + i % 26]) * 350 for i in range(30)]
    for item in items:
        assert c.set("q", item) == b"STORED"
    c.close()
    server.stop()
    path = data / "q"
    records, _reader = read_file_records(str(path))
    assert len(records) == 30 and path.stat().st_size == 30 * (21 + 353)
    damaged = records[10]
    blob = bytearray(path.read_bytes())
    struct.pack_into("<i", blob, damaged.offset + 1, 2**31 - 1)  # runs past every record after it
    path.write_bytes(blob)

    server.start()
    c = server.client()
    got = []
    while (value := c.get("q")) is not None:
        got.append(value)
    assert got == items[:10] + items[11:]
    [error] = _events(server, "damaged journal record")
    assert error["level"] == "error" and error["queue"] == "q" and error["file"] == "q"
    assert error["offset"] == damaged.offset and error["damaged_bytes"] == damaged.size
    assert error["items_after"] == 19 and error["resumed_at"] == damaged.offset + damaged.size
    [saved] = os.listdir(data / ".corrupt")
    assert (data / ".corrupt" / saved).read_bytes() == bytes(blob[damaged.offset:damaged.offset + damaged.size])
    assert not _events(server, "journal ends inside a record")


def test_a_long_zero_tail_is_saved_aside_only_up_to_the_limit(tmp_path, started):
    data = tmp_path / "data"
    data.mkdir()
    good = addx(b"one") + addx(b"two")
    with open(data / "q", "wb") as file:
        file.write(good)
        file.truncate(len(good) + SAVE_LIMIT + (1 << 20))  # a tail of zeros (a hole)
    server = started(data)
    assert (data / "q").read_bytes() == good  # cut before the server listened
    c = server.client()
    assert c.get("q") == b"one" and c.get("q") == b"two" and c.get("q") is None
    [saved] = os.listdir(data / ".corrupt")
    assert (data / ".corrupt" / saved).stat().st_size == SAVE_LIMIT
    [error] = _events(server, "damaged journal record")
    assert error["saved_bytes"] == SAVE_LIMIT and error["damaged_bytes"] == SAVE_LIMIT + (1 << 20)
    assert error["items_after"] == 0 and error["resumed_at"] is None


# -- case 7: things that are not regular files ---------------------------------------------------

def test_pipes_sockets_and_directories_are_skipped_never_opened(tmp_path, started):
    data = tmp_path / "data"
    data.mkdir()
    (data / "q").write_bytes(addx(b"kept"))
    os.mkfifo(data / "q.3000")             # named like an archive of q
    os.mkfifo(data / "pipe")               # named like a queue
    (data / "q.4000").mkdir()
    (data / "dirqueue").mkdir()
    (data / "r.5").write_bytes(addx(b"archived"))
    os.mkfifo(data / "r")                  # in the place of r's current journal
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(str(data / "sock.6000"))
    try:
        server = started(data, timeout=15)
        c = server.client()
        assert c.get("q") == b"kept"
        assert c.set("q", b"new") == b"STORED" and c.get("q") == b"new"
        assert raw_reply(c, b"stats").endswith(b"END\r\n")
        skipped = {e["file"] for e in _events(server, "ignoring something in the journal directory")}
        assert {"q.3000", "pipe", "q.4000", "dirqueue", "r", "sock.6000"} <= skipped
        [error] = _events(server, "cannot open a queue")
        assert error["queue"] == "r"
        assert (data / "r.5").read_bytes() == addx(b"archived")  # left alone
    finally:
        unix.close()
