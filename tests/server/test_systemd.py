"""systemd can run the server (issue 54 point 5): ``serve`` speaks ``Type=notify`` to a real
unix datagram socket standing in for systemd (``READY=1`` only once every port listens and the
journals are replayed; ``RELOADING=1`` with ``MONOTONIC_USEC``, then ``READY=1``, around a
SIGHUP; ``STOPPING=1`` when it begins to shut down); its log goes to stdout one line per event
without colour when stdout is not a terminal; ``contrib/kestrel-actors.service`` passes
``systemd-analyze verify`` and its sample config loads."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from kestrel_actors.config import load_config

from ..helpers import REPO, ServerProcess, act, free_port, request, spawn_logged

UNIT = REPO / "contrib" / "kestrel-actors.service"
SAMPLE_CONFIG = REPO / "contrib" / "kestrel.toml"
DEADLINE = 60.0
"""Seconds a notification may take to come (generous: the shared machine is loaded)."""


class Manager:
    """A unix datagram socket where systemd's would be: what the server sends, in order."""

    def __init__(self, abstract: bool = False) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if abstract:
            name = f"kestrel-actors-test-{os.getpid()}-{time.monotonic_ns()}"
            self.sock.bind("\0" + name)
            self.address = "@" + name
            self._dir = None
        else:
            self._dir = tempfile.mkdtemp(prefix="ka-notify-", dir="/tmp")  # sun_path holds 107 bytes
            self.address = os.path.join(self._dir, "notify")
            self.sock.bind(self.address)

    def next(self, timeout: float = DEADLINE) -> dict[str, str]:
        """The next notification, as its ``NAME=value`` lines."""
        self.sock.settimeout(timeout)
        data = self.sock.recv(4096).decode()
        return dict(line.split("=", 1) for line in data.splitlines() if line)

    def close(self) -> None:
        self.sock.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)


@pytest.fixture
def manager():
    found = Manager()
    yield found
    found.close()


def spawn(server: ServerProcess, notify_socket: str) -> None:
    """Start ``server`` with ``$NOTIFY_SOCKET`` set, without waiting for its ports."""
    server.data_dir.mkdir(parents=True, exist_ok=True)
    env_before = os.environ.get("NOTIFY_SOCKET")
    os.environ["NOTIFY_SOCKET"] = notify_socket
    try:
        server.proc = spawn_logged(server.command(), server.log_path)
    finally:
        if env_before is None:
            del os.environ["NOTIFY_SOCKET"]
        else:
            os.environ["NOTIFY_SOCKET"] = env_before


def test_ready_after_replay_and_every_listener_then_reloading_and_stopping(tmp_path, manager):
    config = tmp_path / "kestrel.toml"
    config.write_text('[queues."jobs"]\nmax_items = 100\n')
    text_port = free_port()
    server = ServerProcess(tmp_path / "data", ("--config", str(config), "--text-port", str(text_port)),
                           admin_port=True, thrift_port=True)
    server.start()  # a first life: items for the next start to replay
    client = server.client()
    for number in range(50):
        assert client.set("jobs", b"item %d" % number) == b"STORED"
    client.close()
    assert server.stop() == 0

    spawn(server, manager.address)
    try:
        ready = manager.next()
        assert ready["READY"] == "1" and ready["MAINPID"] == str(server.proc.pid)
        # ready means ready: every port takes a connection at once, and the journal is replayed
        for port in (server.port, text_port, server.thrift_port, server.admin_port):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        client = server.client()
        assert client.stats()["queue_jobs_items"] == "50"
        assert request(server.admin_url + "/health").status == 200

        before = time.monotonic_ns() // 1000
        server.proc.send_signal(signal.SIGHUP)
        reloading = manager.next()
        after = time.monotonic_ns() // 1000
        assert reloading["RELOADING"] == "1"
        assert before <= int(reloading["MONOTONIC_USEC"]) <= after  # CLOCK_MONOTONIC, as systemd reads it
        assert manager.next()["READY"] == "1"
        assert client.stats()["queue_jobs_items"] == "50"  # still serving
        client.close()

        server.proc.send_signal(signal.SIGTERM)
        assert manager.next() == {"STOPPING": "1"}
        assert server.proc.wait(DEADLINE) == 0
    finally:
        server.stop(signal.SIGKILL)


def test_an_abstract_notify_socket_and_a_quiesce(tmp_path):
    manager = Manager(abstract=True)
    server = ServerProcess(tmp_path / "data", admin_port=True)
    try:
        spawn(server, manager.address)
        assert manager.next()["READY"] == "1"
        assert act(server.admin_url + "/quiesce").status == 200
        assert manager.next() == {"STOPPING": "1"}  # once, though the quiesce then shuts down
        assert server.proc.wait(DEADLINE) == 0
        manager.sock.setblocking(False)
        with pytest.raises(BlockingIOError):
            manager.sock.recv(4096)
    finally:
        server.stop(signal.SIGKILL)
        manager.close()


EVENT = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z \[(debug|info|warning|error|critical) *\] \S")
"""A console event's line: its time, its level, its message."""


def test_serve_logs_to_stdout_one_line_per_event_without_colour(tmp_path, manager):
    """stdout a pipe (as under systemd): the events are there, one a line, no ANSI colour; a
    reload whose file is broken (a multi-line TOML error) is still one line."""
    config = tmp_path / "kestrel.toml"
    config.write_text('[queue_defaults]\nmax_items = 10\n')
    port = free_port()
    command = [sys.executable, "-m", "kestrel_actors.cli", "serve", "--port", str(port), "--text-port", "0",
               "--thrift-port", "0", "--admin-port", "0", "--data-dir", str(tmp_path / "data"),
               "--config", str(config)]
    env = dict(os.environ, NOTIFY_SOCKET=manager.address, TERM="xterm-256color")  # a terminal type, no terminal
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        assert manager.next()["READY"] == "1"
        config.write_text('[queue_defaults]\nmax_items = "ten"\n[[broken\n')
        proc.send_signal(signal.SIGHUP)
        assert manager.next()["RELOADING"] == "1"
        assert manager.next()["READY"] == "1"  # the running configuration stays
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=DEADLINE)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    text = stdout.decode()
    assert proc.returncode == 0, (text, stderr)
    assert "\x1b[" not in text
    lines = text.splitlines()
    assert all(EVENT.match(line) for line in lines), lines
    for message in ("listening", "reload failed", "shutting down", "goodbye"):
        assert sum(message in line for line in lines) == 1, (message, lines)
    assert stderr == b"", stderr


def test_the_unit_passes_systemd_analyze_verify_and_its_config_loads(tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.fail("systemd-analyze is missing: make test installs Debian's systemd")
    unit = UNIT.read_text()
    exec_start = re.search(r"^ExecStart=(\S+) serve --config (\S+)$", unit, re.M)
    assert exec_start is not None, unit
    assert re.search(r"^Type=notify$", unit, re.M)
    assert re.search(r"^ExecReload=/bin/kill -HUP \$MAINPID$", unit, re.M)
    assert re.search(r"^ProtectSystem=strict$", unit, re.M)
    # the data directory the unit lets it write is the sample config's
    config = load_config(str(SAMPLE_CONFIG))
    assert f"ReadWritePaths={config.data_dir}\n" in unit
    assert exec_start.group(2) == "/etc/kestrel-actors/kestrel.toml"

    # verify checks that ExecStart's program exists: this checkout's, where the unit names the
    # installed one
    installed = Path(sys.executable).parent / "kestrel-actors"
    assert installed.exists(), installed
    copy = tmp_path / UNIT.name
    copy.write_text(unit.replace(exec_start.group(1), str(installed)))
    result = subprocess.run(["systemd-analyze", "verify", str(copy)], capture_output=True, text=True,
                            timeout=120, cwd=tmp_path)
    # an unknown key or a bad value is only a warning (exit 0): nothing may be said at all
    assert (result.returncode, result.stdout, result.stderr) == (0, "", ""), result
