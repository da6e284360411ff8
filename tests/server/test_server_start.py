"""What the server does to its own process when it starts serving."""

from __future__ import annotations

import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from ..helpers import REPO, free_port


def test_serving_tunes_the_cyclic_gc_and_freezes_what_start_up_made():
    """Run in a child process: the collector's settings are the whole process's."""
    code = (
        "import gc\n"
        "from kestrel_actors.server import GC_THRESHOLDS, _tune_gc\n"
        "assert gc.get_threshold() != GC_THRESHOLDS\n"
        "_tune_gc()\n"
        "assert gc.get_threshold() == GC_THRESHOLDS, gc.get_threshold()\n"
        "assert gc.get_freeze_count() > 1000, gc.get_freeze_count()\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_a_port_that_cannot_be_had_closes_the_ones_already_open(tmp_path):
    """Run in a child process that stays alive after the failure: the memcache and text
    ports, opened before the thrift and admin ports, must not go on taking connections (the
    kernel completes them, and the process's exit then resets them)."""
    code = (
        "import socket, sys\n"
        "from kestrel_actors.config import ServerConfig\n"
        "from kestrel_actors.server import Server, StartupError\n"
        "port, text, thrift, admin = (int(arg) for arg in sys.argv[1:5])\n"
        "data = sys.argv[5]\n"
        "held = socket.create_server(('127.0.0.1', int(sys.argv[6])))\n"
        "config = ServerConfig(port=port, text_port=text, thrift_port=thrift, admin_port=admin, data_dir=data)\n"
        "try:\n"
        "    Server(config).start()\n"
        "except StartupError as exc:\n"
        "    print('refused:', exc)\n"
        "else:\n"
        "    sys.exit('started on a port that is taken')\n"
        "for open_before in (port, text):\n"
        "    try:\n"
        "        socket.create_connection(('127.0.0.1', open_before), timeout=1).close()\n"
        "    except ConnectionRefusedError:\n"
        "        continue\n"
        "    sys.exit(f'port {open_before} still takes connections')\n"
    )
    for taken in ("thrift", "admin"):
        ports = {name: free_port() for name in ("port", "text", "thrift", "admin")}
        args = [str(ports[name]) for name in ("port", "text", "thrift", "admin")]
        result = subprocess.run([sys.executable, "-c", code, *args, str(tmp_path / taken), str(ports[taken])],
                                cwd=REPO, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, (taken, result.stdout, result.stderr[-2000:])
        assert f"cannot listen on 127.0.0.1:{ports[taken]}" in result.stdout


def test_the_listener_gives_client_sockets_their_options_and_says_what_waits():
    """The listening socket carries every client socket's options, which the kernel copies to
    each socket it accepts (no ``setsockopt`` per connection), and the listener hands over how
    many bytes of a newcomer's first read already wait (no second ``FIONREAD`` for them)."""
    code = (
        "import socket, gevent\n"
        "from kestrel_actors.server import _Listener\n"
        "from kestrel_actors.session import CLIENT_SOCKET_OPTIONS\n"
        "accepted = []\n"
        "listener = _Listener(('127.0.0.1', 0), lambda sock, address, waiting=None: accepted.append((sock, waiting)),"
        " spawn=None)\n"
        "listener.start()\n"
        "clients = []\n"
        "for request in (b'get q\\r\\n', b''):\n"
        "    client = socket.create_connection(('127.0.0.1', listener.server_port))\n"
        "    client.sendall(request)\n"
        "    clients.append(client)\n"
        "    with gevent.Timeout(10):\n"
        "        while len(accepted) < len(clients):\n"
        "            gevent.sleep(0.01)\n"
        "for sock, _waiting in accepted:\n"
        "    for level, option, value in CLIENT_SOCKET_OPTIONS:\n"
        "        assert sock.getsockopt(level, option) == value, (level, option)\n"
        "assert [waiting for _sock, waiting in accepted] == [7, 0], accepted\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_a_failed_set_up_pauses_the_listener_then_it_serves_the_next_client():
    """A client whose set-up raises (not an out-of-descriptors refusal) is handled as gevent's
    accept loop does: reported to the hub, the listener pauses for ``delay`` (doubled each time
    in a row), then accepts again, and a success resets the pause."""
    code = (
        "import socket, gevent\n"
        "from kestrel_actors.server import _Listener\n"
        "accepted = []\n"
        "def handle(sock, address, waiting=None):\n"
        "    accepted.append(sock)\n"
        "    if len(accepted) == 1:\n"
        "        raise RuntimeError('set-up failed')\n"
        "listener = _Listener(('127.0.0.1', 0), handle, spawn=None)\n"
        "listener.start()\n"
        "first_delay = listener.delay\n"
        "clients = [socket.create_connection(('127.0.0.1', listener.server_port))]\n"
        "with gevent.Timeout(10):\n"
        "    while not accepted:\n"
        "        gevent.sleep(0.001)\n"
        "assert listener.delay == 2 * first_delay, (listener.delay, first_delay)\n"
        "clients.append(socket.create_connection(('127.0.0.1', listener.server_port)))\n"
        "with gevent.Timeout(10):\n"
        "    while len(accepted) < 2:\n"
        "        gevent.sleep(0.001)\n"
        "assert listener.delay == first_delay, listener.delay\n"
        "assert not listener.closed\n"
        "print('served after the pause')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "served after the pause" in result.stdout
    assert "RuntimeError: set-up failed" in result.stderr  # the hub's report of it


_SYSCALL = re.compile(r"^\d+\s+(\w+)\((\d+)?(?:, (\w+))?(?:, (\d+))?")


def _syscalls_per_connection(trace: str) -> list[list[str]]:
    """Each accepted connection's system calls on its descriptor, from its ``accept4`` to its
    ``close``, out of an ``strace -f`` of the server (``epoll_ctl`` names it third)."""
    lives: dict[int, list[str]] = {}
    done: list[list[str]] = []
    for line in trace.splitlines():
        match = _SYSCALL.match(line)
        if match is None:
            continue
        name, first, second, third = match.groups()
        accepted = re.search(r"^\d+\s+accept4?\(.*\) = (\d+)$", line)
        if accepted:
            lives[int(accepted.group(1))] = ["accept4"]
            continue
        fd = int(third) if name == "epoll_ctl" and third else int(first) if first else -1
        if fd in lives:
            call = f"{name} {second}" if name in ("ioctl", "fcntl") else name
            if call == "ioctl FIONREAD" and ", [0])" in line:
                call += " found nothing"  # asked before the client's bytes came: asked again then
            lives[fd].append(call)
            if name == "close":
                done.append(lives.pop(fd))
    return done


@pytest.mark.skipif(shutil.which("strace") is None, reason="counted with strace")
def test_a_connection_costs_the_server_no_system_call_beyond_its_io(make_server):
    """A client that asks once and hangs up costs the server its accept, one ``FIONBIO`` (its
    socket made non-blocking), one ``FIONREAD`` (how heavy its first read is), its reads, its
    answer, its watcher's registration and its close: no ``getsockname`` (a ``socket`` object
    made from the descriptor checks it) and, from the second connection on, no ``fcntl`` (a fresh
    gevent watcher checks its descriptor; a closed connection's watcher is handed on)."""
    server = make_server()
    trace_path = server.data_dir.parent / "strace.txt"
    tracer = subprocess.Popen(["strace", "-f", "-qq", "-o", str(trace_path), "-p", str(server.proc.pid)],
                              stderr=subprocess.PIPE)
    try:
        time.sleep(1.0)  # strace attaches to every thread
        if tracer.poll() is not None:
            pytest.skip(f"strace cannot attach here: {tracer.stderr.read().decode(errors='replace')[-300:]}")
        for _ in range(6):
            with socket.create_connection((server.host, server.port), timeout=10) as client:
                client.sendall(b"get nothing_here\r\n")
                assert client.recv(64) == b"END\r\n"
                client.shutdown(socket.SHUT_WR)
                assert client.recv(64) == b""  # the server closed its side: the life is over
    finally:
        time.sleep(0.5)
        tracer.send_signal(signal.SIGINT)
        tracer.wait(10)
    lives = _syscalls_per_connection(trace_path.read_text())
    assert len(lives) >= 6, lives
    for life in lives[1:]:
        assert "getsockname" not in life, life
        assert not any(call.startswith("fcntl") for call in life), life
        # a connection accepted before its request came (a loaded machine) asks once more
        early = life.count("ioctl FIONREAD found nothing")
        assert early <= 1 and life.index("read") > life.index("ioctl FIONREAD"), life
        assert life.count("ioctl FIONBIO") == 1 and life.count("ioctl FIONREAD") == 1, life
        assert len(life) <= 9 + early, life
