"""A reload that fails says so (issue 21.6): memcache ``reload`` answers ``SERVER_ERROR config not
reloaded: <reason>`` on one line, admin ``/reload`` answers 500 with the reason, the running
configuration stays; SIGHUP reloads (and a failed one is one log line, the server going on)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from ..helpers import ServerProcess, log_lines, request, wait_for

GOOD = "[queues.jobs]\nmax_items = 1\n"
BETTER = "[queues.jobs]\nmax_items = 3\n"
BROKEN = {
    "bad TOML": ("[queues.jobs\nmax_items = 3\n", "invalid TOML"),
    "wrong type": ('[queues.jobs]\nmax_items = "three"\n', "max_items"),
    "missing file": (None, "cannot read the config file"),
}


def break_config(config: Path, text: str | None) -> None:
    if text is None:
        config.unlink()
    else:
        config.write_text(text)


def max_items(server: ServerProcess) -> int:
    """What the server enforces: how many SETs to an empty ``jobs`` are STORED."""
    client = server.client()
    try:
        stored = 0
        while client.set("jobs", b"x") == b"STORED":
            stored += 1
            assert stored < 10
        while client.get("jobs") is not None:
            pass
        return stored
    finally:
        client.close()


def named(server: ServerProcess, event: str) -> list[dict]:
    return [e for e in log_lines(server)[0] if e.get("event") == event]


@pytest.fixture
def configured(tmp_path):
    config = tmp_path / "kestrel.toml"
    config.write_text(GOOD)
    server = ServerProcess(tmp_path / "data", ("--config", str(config)), admin_port=True).start()
    yield server, config
    server.stop()


@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_memcache_reload_of_an_unusable_file_answers_why_and_keeps_the_config(configured, kind):
    server, config = configured
    text, reason = BROKEN[kind]
    client = server.client()
    break_config(config, text)
    client.send(b"reload\r\n")
    reply = client.read_line()
    assert reply.startswith(b"SERVER_ERROR config not reloaded: " + str(config).encode()), reply
    assert reason.encode() in reply, reply
    assert b"\r" not in reply and b"\n" not in reply
    assert client.call(b"version").startswith(b"VERSION ")  # one line: nothing else follows
    assert max_items(server) == 1
    config.write_text(BETTER)
    assert client.call(b"reload") == b"Reloaded config."
    assert max_items(server) == 3


@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_admin_reload_of_an_unusable_file_answers_500_with_the_reason(configured, kind):
    server, config = configured
    text, reason = BROKEN[kind]
    break_config(config, text)
    for path in ("/reload", "/reload.txt"):
        reply = request(server.admin_url + path)
        assert reply.status == 500, reply
        error = reply.json()["error"]
        assert error.startswith(f"config not reloaded: {config}") and reason in error, error
    assert max_items(server) == 1
    config.write_text(BETTER)
    assert request(server.admin_url + "/reload").json() == {"response": "ok"}
    assert max_items(server) == 3


def test_sighup_reloads_and_a_failed_one_is_logged_once_and_the_server_goes_on(configured):
    server, config = configured
    pid = server.proc.pid
    config.write_text(BETTER)
    server.proc.send_signal(signal.SIGHUP)
    assert wait_for(lambda: named(server, "configuration reloaded"), 10), server.log()
    assert server.proc.poll() is None
    assert max_items(server) == 3

    config.write_text('[queues.jobs]\nmax_items = "five"\n')
    server.proc.send_signal(signal.SIGHUP)
    assert wait_for(lambda: named(server, "reload failed; keeping the running configuration"), 10), server.log()
    time.sleep(0.2)
    assert server.proc.poll() is None and server.proc.pid == pid
    [failed] = named(server, "reload failed; keeping the running configuration")
    assert "max_items" in failed["error"] and "\n" not in failed["error"], failed
    assert not log_lines(server)[1], "lines that are not one JSON event"
    assert max_items(server) == 3
    assert len(named(server, "SIGHUP: reloading the configuration")) == 2


def test_sighup_without_a_config_file_changes_nothing(tmp_path):
    server = ServerProcess(tmp_path / "data").start()
    try:
        assert server.client().set("jobs", b"kept") == b"STORED"
        server.proc.send_signal(signal.SIGHUP)
        assert wait_for(lambda: named(server, "SIGHUP: reloading the configuration"), 10), server.log()
        assert server.proc.poll() is None
        assert server.client().get("jobs") == b"kept"
    finally:
        server.stop()
