"""A confirm that was answered is never delivered again (issue 21 point 2).

Every way of confirming (memcache ``/close``, ``confirm`` after ``monitor``, thrift
``confirm``, and the reads that consume at once: a plain GET, a thrift ``get`` without
``auto_abort_msec``) is answered only once its record is as durable as the queue's
``sync_journal`` says, and a shutdown (SIGTERM, ``shutdown``) answers nothing it has not
written: after a SIGKILL or a SIGTERM, no item whose confirm was answered comes back, and
no acknowledged SET is lost.
"""

from __future__ import annotations

import signal
import socket
import threading
import time

import pytest

from ..helpers import Client, ServerProcess, drain_queue

REPLY_TIMEOUT = 5.0
ALWAYS = ("--sync-journal", "always")


def _fill(server: ServerProcess, queue: str, count: int) -> list[bytes]:
    client = server.client(REPLY_TIMEOUT)
    items = [b"%s-%d" % (queue.encode(), i) for i in range(count)]
    for item in items:
        assert client.set(queue, item) == b"STORED"
    client.close()
    return items


def test_thrift_confirm_is_durable_before_its_answer(tmp_path):
    """Of 20 items confirmed over thrift and then a SIGKILL, none comes back (10 did when the
    confirm was answered before the queue had journaled it)."""
    server = ServerProcess(tmp_path / "data", ALWAYS, thrift_port=True).start()
    try:
        _fill(server, "work", 20)
        readers = [server.thrift_client(REPLY_TIMEOUT) for _ in range(20)]  # one open read each
        ids = []
        for reader in readers:
            [item] = reader.get("work", 1, 0, auto_abort_msec=60_000)
            ids.append(item.id)
        assert readers[0].confirm("work", ids) == 20  # any connection may confirm any id
        server.kill()  # at once: the answer must not have come before the record
        for reader in readers:
            reader.close()
        server.start()
        assert drain_queue(server, "work") == []
    finally:
        server.kill()


def test_memcache_close_is_durable_before_its_answer(tmp_path):
    """The memcache twin: ``/open`` then ``/close`` on a fresh connection each, then SIGKILL."""
    server = ServerProcess(tmp_path / "data", ALWAYS).start()
    try:
        _fill(server, "work", 20)
        for _ in range(20):
            client = server.client(REPLY_TIMEOUT)
            assert client.get("work/open") is not None
            assert client.call(b"get work/close") == b"END"
            client.close()
        server.kill()
        server.start()
        assert drain_queue(server, "work") == []
    finally:
        server.kill()
