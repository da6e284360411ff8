"""A reload that fails says so (issue 21.6): memcache ``reload`` answers ``SERVER_ERROR config not
reloaded: <reason>`` on one line, admin ``/reload`` answers 500 with the reason, the running
configuration stays; SIGHUP reloads (and a failed one is one log line, the server going on)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from ..helpers import ServerProcess, act, log_lines, wait_for

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
        reply = act(server.admin_url + path)
        assert reply.status == 500, reply
        error = reply.json()["error"]
        assert error.startswith(f"config not reloaded: {config}") and reason in error, error
    assert max_items(server) == 1
    config.write_text(BETTER)
    assert act(server.admin_url + "/reload").json() == {"response": "ok"}
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


# the running token, and a new one written as a TOML table, an inline table and an array
RUNNING_TOKEN = "running-token-4f1a9c"
TOKEN_AS_OTHER_TYPES = {
    "table": ('[admin_token]\nvalue = "table-token-7e2b"\n', "table-token-7e2b"),
    "inline table": ('admin_token = { value = "inline-token-8d3c" }\n', "inline-token-8d3c"),
    "array": ('admin_token = ["array-token-9a4d", "second-token-0b5e"]\n', "array-token-9a4d"),
}


@pytest.mark.parametrize("kind", sorted(TOKEN_AS_OTHER_TYPES))
def test_a_reload_error_never_shows_the_token(tmp_path, kind):
    """Issue 53.5: ``admin_token`` as a table or an array was echoed in the reload error, over
    memcache (no authentication) and in the log. The reply says what is wrong, and no reply
    and no log line holds the token's text, nor the running one's."""
    text, secret = TOKEN_AS_OTHER_TYPES[kind]
    config = tmp_path / "kestrel.toml"
    config.write_text(f'admin_token = "{RUNNING_TOKEN}"\n' + GOOD)
    server = ServerProcess(tmp_path / "data", ("--config", str(config)), admin_port=True).start()
    try:
        config.write_text(GOOD + text if text.startswith("[") else text + GOOD)
        client = server.client()
        client.send(b"reload\r\n")
        memcache_reply = client.read_line()
        assert secret.encode() not in memcache_reply, memcache_reply
        assert memcache_reply.startswith(b"SERVER_ERROR config not reloaded: "), memcache_reply
        assert b"admin_token" in memcache_reply, memcache_reply
        assert (b"got an array" if kind == "array" else b"got a table") in memcache_reply, memcache_reply
        http_reply = act(server.admin_url + "/reload", token=RUNNING_TOKEN)
        assert http_reply.status == 500 and "admin_token" in http_reply.json()["error"], http_reply
        assert max_items(server) == 1  # the running configuration stays
        assert server.proc.poll() is None
    finally:
        server.stop()
    everything = memcache_reply + http_reply.body + server.log_path.read_bytes()
    for token in (secret, "second-token-0b5e", RUNNING_TOKEN):
        assert token.encode() not in everything, (token, everything.decode(errors="replace")[-2000:])
    assert len(named(server, "reload failed; keeping the running configuration")) == 2
