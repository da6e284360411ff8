"""Server status on a real server (behaviour §7.2, §2.3, §3, §10.13).

``status`` replies the status; ``status <name>`` changes it. ReadOnly blocks writes (set,
flush, flush_all, delete, flush_expired), Quiescent blocks reads too; confirm, ``get q/close``,
``get q/abort``, stats, version, status and flush_all_expired are always allowed. Memcache
answers a blocked command with ``SERVER_ERROR`` and closes; the text protocol answers
``-Server not available for operation <op>`` and stays open. The status is persisted in the
data directory and read back at start-up; ``status_change_grace_period`` delays enforcement
of a stricter status.
"""

from __future__ import annotations

import time

import pytest

from ..helpers import LONG_WAIT_MS, Client, ServerProcess, start_text_server, text_client, wait_for


def fresh(server: ServerProcess) -> Client:
    return server.client()


def blocked(client: Client, request: bytes) -> None:
    """``request`` gets ``SERVER_ERROR`` and the connection is closed."""
    assert client.call(request) == b"SERVER_ERROR"
    assert client.is_closed()


def set_request(queue: str, data: bytes) -> bytes:
    return b"set %s 0 0 %d\r\n%s" % (queue.encode(), len(data), data)


# -- memcache ----------------------------------------------------------------------------------


def test_status_is_up_by_default(server):
    client = server.client()
    assert client.call(b"status") == b"UP"


def test_readonly_blocks_writes_but_not_reads(server):
    admin = server.client()
    assert admin.set("ro", b"one") == b"STORED"
    assert admin.set("ro", b"two") == b"STORED"
    assert admin.call(b"status readonly") == b"END"
    assert admin.call(b"status") == b"READONLY"
    writer = fresh(server)
    assert writer.set("ro", b"three") == b"SERVER_ERROR"
    assert writer.is_closed()
    reader = fresh(server)
    assert reader.get("ro") == b"one"
    assert reader.get("ro/peek") == b"two"
    assert reader.get("ro/open") == b"two"
    assert reader.get("ro/close") is None
    stats = reader.stats()
    assert stats["queue_ro_items"] == "0"
    assert stats["cmd_set"] == "2"  # the refused SET is not counted (behaviour §2.4)
    assert reader.call(b"flush_all_expired") == b"0"  # never blocked
    assert reader.call(b"version").startswith(b"VERSION ")


@pytest.mark.parametrize("request_line", [
    b"flush ro2", b"flush ro2missing", b"flush_all", b"delete ro2", b"delete ro2missing",
])
def test_readonly_blocks_flush_flush_all_and_delete(server, request_line):
    admin = server.client()
    assert admin.set("ro2", b"kept") == b"STORED"
    assert admin.call(b"status readonly") == b"END"
    blocked(fresh(server), request_line)
    assert fresh(server).get("ro2") == b"kept"


@pytest.mark.parametrize("queue", [b"ro3", b"ro3missing"])
def test_readonly_flush_expired_drops_the_connection(make_server, queue):
    server = make_server("--expiration-timer-frequency", "0")
    admin = server.client()
    assert admin.set("ro3", b"x", -1) == b"STORED"
    assert admin.call(b"status readonly") == b"END"
    client = fresh(server)
    client.send(b"flush_expired " + queue + b"\r\n")
    assert client.is_closed()
    assert client.buffer == b""
    assert fresh(server).stats()["queue_ro3_expired_items"] == "0"


def test_quiescent_blocks_reads_but_confirm_works(server):
    admin = server.client()
    assert admin.set("qs", b"held") == b"STORED"
    assert admin.set("qs", b"next") == b"STORED"
    holder = fresh(server)
    assert holder.get("qs/open") == b"held"
    assert admin.call(b"status quiescent") == b"END"
    assert admin.call(b"status") == b"QUIESCENT"
    blocked(fresh(server), b"get qs")
    blocked(fresh(server), b"get qs/peek")
    blocked(fresh(server), b"get qs/open")
    blocked(fresh(server), set_request("qs", b"x"))
    assert holder.call(b"confirm qs 1") == b"END"
    assert holder.get("qs/abort") is None  # allowed; nothing open
    stats = holder.stats()
    assert stats["queue_qs_open_transactions"] == "0"
    assert stats["queue_qs_items"] == "1"


def test_quiescent_close_and_abort_are_allowed(server):
    admin = server.client()
    assert admin.set("qs2", b"a") == b"STORED"
    assert admin.set("qs2", b"b") == b"STORED"
    holder = fresh(server)
    assert holder.get("qs2/open") == b"a"
    assert admin.call(b"status quiescent") == b"END"
    assert holder.get("qs2/abort") is None
    assert holder.stats()["queue_qs2_items"] == "2"
    assert admin.call(b"status up") == b"END"
    assert holder.get("qs2/open") == b"a"
    assert admin.call(b"status quiescent") == b"END"
    assert holder.get("qs2/close") is None
    assert holder.stats()["queue_qs2_items"] == "1"


def test_quiescent_monitor_drops_the_connection(server):
    admin = server.client()
    assert admin.call(b"status quiescent") == b"END"
    client = fresh(server)
    client.send(b"monitor qsm 1 1\r\n")
    assert client.is_closed()
    assert client.buffer == b""


@pytest.mark.parametrize("name", [b"bogus", b"down", b"DOWN"])
def test_bad_status_name_is_client_error_and_close(server, name):
    client = server.client()
    assert client.call(b"status " + name) == b"CLIENT_ERROR"
    assert client.is_closed()
    other = fresh(server)
    assert other.call(b"status") == b"UP"


@pytest.mark.parametrize(("name", "reply"), [
    (b"ReadOnly", b"READONLY"), (b"WRITEAVOID", b"WRITEAVOID"), (b"Quiescent", b"QUIESCENT"),
])
def test_status_names_are_case_insensitive(server, name, reply):
    client = server.client()
    assert client.call(b"status " + name) == b"END"
    assert client.call(b"status") == reply


def test_writeavoid_allows_reads_and_writes(server):
    client = server.client()
    assert client.call(b"status writeavoid") == b"END"
    assert client.set("wa", b"x") == b"STORED"
    assert client.get("wa") == b"x"
    assert client.call(b"delete wa") == b"DELETED"


def test_loosening_the_status_lets_writes_through_again(server):
    client = server.client()
    assert client.call(b"status readonly") == b"END"
    assert client.call(b"status up") == b"END"
    assert client.set("loose", b"x") == b"STORED"


def test_status_persists_across_a_restart(server):
    client = server.client()
    assert client.call(b"status readonly") == b"END"
    client.close()
    server.restart()
    client = server.client()
    assert client.call(b"status") == b"READONLY"
    assert client.set("persist", b"x") == b"SERVER_ERROR"
    client = server.client()
    assert client.call(b"status up") == b"END"
    client.close()
    server.restart()
    assert server.client().call(b"status") == b"UP"


def test_items_and_status_survive_a_restart_together(server):
    """A read-only server restarted keeps its items readable (needs the journal)."""
    client = server.client()
    assert client.set("rsurv", b"kept") == b"STORED"
    assert client.call(b"status readonly") == b"END"
    client.close()
    server.restart()
    client = server.client()
    assert client.call(b"status") == b"READONLY"
    assert client.get("rsurv") == b"kept"


def test_default_status_from_the_config(make_server, tmp_path):
    config = tmp_path / "status.toml"
    config.write_text('default_status = "ReadOnly"\n')
    server = make_server("--config", str(config))
    client = server.client()
    assert client.call(b"status") == b"READONLY"
    assert client.set("dflt", b"x") == b"SERVER_ERROR"


def test_grace_period_reports_at_once_and_enforces_not_yet(make_server, tmp_path):
    """A stricter status is reported at once, and during the grace period it is not enforced and
    a further stricter change is rejected silently. The period is far beyond the clients'
    patience, so however long load holds this test back, every check falls inside it (when the
    period ends is the pure tests' business: ``test_status.py``, on a fake clock)."""
    config = tmp_path / "grace.toml"
    config.write_text(f'status_change_grace_period = "{LONG_WAIT_MS}ms"\n')
    server = make_server("--config", str(config))
    admin = server.client()
    assert admin.call(b"status readonly") == b"END"
    assert admin.call(b"status") == b"READONLY"  # reported at once
    assert admin.set("grace", b"early") == b"STORED"  # not enforced yet
    assert fresh(server).set("grace", b"fresh") == b"STORED"  # on a new connection neither
    # while the change is pending, a further stricter change is rejected silently
    assert admin.call(b"status quiescent") == b"END"
    assert admin.call(b"status") == b"READONLY"
    assert admin.get("grace") == b"early"  # nor are reads blocked
    # a loosening change applies at once, and cancels the pending one
    assert admin.call(b"status up") == b"END"
    assert admin.call(b"status") == b"UP"
    assert admin.set("grace", b"after") == b"STORED"
    assert admin.get("grace") == b"fresh"
    assert admin.get("grace") == b"after"


def test_grace_period_enforces_the_stricter_status_when_it_is_over(make_server, tmp_path):
    """Once the (short) grace period is over, the stricter status is enforced: a write is
    refused. Writes until then are stored; the test waits for the refusal, not for a time."""
    config = tmp_path / "grace.toml"
    config.write_text('status_change_grace_period = "300ms"\n')
    server = make_server("--config", str(config))
    admin = server.client()
    assert admin.call(b"status readonly") == b"END"
    stored = 0

    def refused() -> bool:
        nonlocal stored
        writer = fresh(server)
        reply = writer.set("grace", b"%d" % stored)
        if reply == b"STORED":
            stored += 1
            writer.close()
            return False
        assert reply == b"SERVER_ERROR" and writer.is_closed()
        return True

    assert wait_for(refused)
    assert admin.call(b"status") == b"READONLY"
    assert [admin.get("grace") for _ in range(stored)] == [b"%d" % n for n in range(stored)]
    assert admin.get("grace") is None
    # a loosening change applies at once
    assert admin.call(b"status up") == b"END"
    assert admin.set("grace", b"again") == b"STORED"
    assert admin.get("grace") == b"again"


def test_grace_period_loosening_cancels_the_pending_change(make_server, tmp_path):
    config = tmp_path / "grace.toml"
    config.write_text('status_change_grace_period = "300ms"\n')
    server = make_server("--config", str(config))
    admin = server.client()
    assert admin.call(b"status readonly") == b"END"
    assert admin.call(b"status up") == b"END"
    time.sleep(0.5)
    assert admin.call(b"status") == b"UP"
    assert admin.set("cancel", b"x") == b"STORED"


# -- text protocol (behaviour §3) -------------------------------------------------------------------------


@pytest.fixture
def text_status_server(tmp_path):
    server = start_text_server(tmp_path / "data")
    yield server
    server.stop()


def test_text_status_commands(text_status_server):
    t = text_client(text_status_server)
    assert t.call(b"status") == b":UP"
    assert t.call(b"status bogus") == b"-Unknown status."
    assert t.call(b"status down") == b"-Status forbidden."
    assert t.call(b"status") == b":UP"  # still open, unchanged
    assert t.call(b"status ReadOnly") == b"+0"
    assert t.call(b"status") == b":READONLY"
    assert text_status_server.client().call(b"status") == b"READONLY"  # one status, both ports


def test_text_readonly_refuses_writes_and_stays_open(text_status_server):
    t = text_client(text_status_server)
    assert t.put("trq", b"kept") == b"+1"
    assert t.call(b"status readonly") == b"+0"
    assert t.put("trq", b"refused") == b"-Server not available for operation setItem"
    assert t.call(b"flush trq") == b"-Server not available for operation flush"
    assert t.call(b"delete trq") == b"-Server not available for operation delete"
    assert t.call(b"flush trqmissing") == b"-Server not available for operation flush"
    assert t.call(b"delete trqmissing") == b"-Server not available for operation delete"
    assert t.call(b"get trq") == b":kept"  # reads still work, on the same connection
    assert t.call(b"get trq") == b"*"
    stats = text_status_server.client().stats()
    assert stats["queue_trq_items"] == "0"
    assert stats["queue_trq_total_items"] == "1"


def test_text_quiescent_refuses_reads_and_confirm_works(text_status_server):
    t = text_client(text_status_server)
    assert t.put("tqq", b"a", b"b") == b"+2"
    assert t.call(b"get tqq") == b":a"
    assert t.call(b"status quiescent") == b"+0"
    assert t.call(b"get tqq") == b"-Server not available for operation getItem"
    assert t.call(b"peek tqq") == b"-Server not available for operation getItem"
    assert t.call(b"monitor tqq 100") == b"-Server not available for operation monitorUntil"
    stats = text_status_server.client().stats()
    assert stats["queue_tqq_items"] == "1"
    assert stats["queue_tqq_open_transactions"] == "0"  # the refused get still confirmed "a"
    assert t.call(b"status up") == b"+0"
    assert t.call(b"get tqq") == b":b"
    assert t.call(b"status quiescent") == b"+0"
    assert t.call(b"confirm tqq 1") == b"+1"
    assert text_status_server.client().stats()["queue_tqq_open_transactions"] == "0"
