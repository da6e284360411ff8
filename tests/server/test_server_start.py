"""What the server does to its own process when it starts serving."""

from __future__ import annotations

import subprocess
import sys

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
