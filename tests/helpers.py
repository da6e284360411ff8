"""The tests' one helpers module: real server processes, clients, and what tests share.

Tests never mock the server: they start a ``kestrel-actors serve`` process on a free loopback
port with a data directory in a temp dir (:class:`ServerProcess`), and may stop it with
SIGTERM or SIGKILL and start it again on the same port and data directory. Below it: raw
memcache and text clients, the exact-bytes helpers of the conformance tests, the journal
file helpers of the durability tests, and :class:`Pipeline` for deeply pipelined traffic.
At the end, the in-process harness: a :class:`World` (a queue collection and the sessions'
context, no sockets) whose sessions write to a :class:`BufferTransport`, for the actors' and
sessions' own tests and the byte-exact tests that need no process. No test module imports
another.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import gevent

from kestrel_actors.actors import QueueBatch, QueueCollection, ServerStats, Session
from kestrel_actors.actors._collection import memory_opener
from kestrel_actors.client import Connection, set_request
from kestrel_actors.config import ServerConfig
from kestrel_actors.messages import Resolve
from kestrel_actors.protocol import MemcacheDecoder
from kestrel_actors.protocol._text import TextDecoder
from kestrel_actors.runtime import Dispatcher, ReplyFuture
from kestrel_actors.session import (
    Disconnected,
    Drain,
    MemcacheHandler,
    Received,
    Reload,
    SessionActor,
    SessionContext,
    Transport,
)
from kestrel_actors.status import ServerStatus

REPO = Path(__file__).resolve().parent.parent
"""The repository's root (the tests sit one folder deeper, in ``tests/<room>/``)."""


def _ephemeral_ports() -> range:
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999  # Linux's default
    return range(low, high + 1)


PATIENCE = 15.0
"""Seconds a test waits for something due at once (a reply, a close, a STATS figure) before it
fails. Generous, because the suite shares its cores with other work and a loaded machine can
hold a process back for seconds; it costs nothing when the thing comes. A test that checks that
something came *at once*, not after a deadline, gives the deadline :data:`LONG_WAIT_MS`, far
beyond this."""

LONG_WAIT_MS = 60_000
"""A blocking read's ``/t=`` (ms) in a test that checks the read ends at once for another
reason (an item, a count, a delete): four times :data:`PATIENCE`, so a read that waited for its
deadline fails the test (the client gives up first) while one held back by load does not."""


_PORT_BLOCK = 1000
_FIRST_PORT = 23000
"""Tests' ports come from blocks of a thousand from here up to the kernel's ephemeral range,
one block per pytest-xdist worker (above Kestrel's 22133 and every default port)."""


@functools.cache
def _port_block() -> range:
    blocks = (_ephemeral_ports().start - _FIRST_PORT) // _PORT_BLOCK
    if blocks < 2:
        return range(0)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) % (blocks - 1) if worker.startswith("gw") else blocks - 1
    start = _FIRST_PORT + index * _PORT_BLOCK
    return range(start, start + _PORT_BLOCK)


_next_ports: Iterator[int] | None = None


def free_port() -> int:
    """A loopback port nothing listens on, that no other test process is handed meanwhile.

    Not the kernel's ``bind(0)``: its port is free only until the test's server binds it, and
    in that second another worker's ``bind(0)`` (its server, a Spark or ZooKeeper process) or
    an outgoing connection can take the same port from the ephemeral range; the test's server
    then fails to start, or the test talks to another process's server (the likeliest cause of
    a ``make run`` test's connection reset, once in a fresh ``make test``). Below that range,
    in this worker's own block, only this process hands ports out; a port in use or in
    TIME_WAIT is skipped.
    """
    global _next_ports
    block = _port_block()
    if not block:  # an ephemeral range too low for the blocks: the kernel's choice
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return sock.getsockname()[1]
    if _next_ports is None:
        first = os.getpid() % len(block)
        _next_ports = itertools.cycle([*block[first:], *block[:first]])
    for port in itertools.islice(_next_ports, len(block)):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {block}")


DEFAULT_PORTS = (22133, 2222, 2229, 2223)
"""Kestrel's default ports, as ``kestrel-actors serve`` listens on them without options."""


@contextlib.contextmanager
def default_ports_held(free_within: float = 300.0) -> Iterator[None]:
    """Hold the lock on Kestrel's default ports (:data:`DEFAULT_PORTS`) while a test serves on
    them, and wait (up to ``free_within`` seconds) until nothing listens on them any more.

    Two tests serving there at once would each reach the other's server: ``make test`` runs two
    pytest-xdist workers, and another checkout's ``make test`` may run beside this one. The lock
    is an abstract unix socket's name, which is exactly as wide as the ports (one network
    namespace) and whatever ``TMPDIR`` each run has; the kernel frees it when its process dies.
    The wait covers a server still shutting down after the test before released the lock."""
    holder = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        while True:
            try:
                holder.bind(f"\0kestrel-actors-tests-default-ports-{os.getuid()}")
                break
            except OSError:
                time.sleep(0.2)
        wait_for(lambda: not any(listening(port) for port in DEFAULT_PORTS), free_within, 0.2)
        yield
    finally:
        holder.close()


def processes_in_group(group: int) -> list[int]:
    """The live processes of process group ``group`` (zombies, which hold nothing, left out)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if fields[0] != "Z" and int(fields[2]) == group:
            members.append(int(stat.parent.name))
    return members


def stop_process_group(proc: subprocess.Popen[bytes], grace: float = 60.0) -> None:
    """SIGTERM the session ``proc`` leads (``start_new_session=True``) and wait until every
    process in it has gone, not only its leader: a server a shell started with ``&`` outlives
    the shell and holds its ports while it shuts down. SIGKILL what is left after ``grace``."""
    def group_gone() -> bool:
        proc.poll()  # reap the leader
        return not processes_in_group(proc.pid)

    for stop in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, stop)
        except ProcessLookupError:
            break
        if wait_for(group_gone, grace, 0.05):
            break
    proc.wait(PATIENCE)


def listening(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts connections on ``host:port`` now."""
    try:
        socket.create_connection((host, port), timeout=0.5).close()
        return True
    except OSError:
        return False


def spawn_logged(command: list[str], log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start ``command`` with its stdout and stderr appended to ``log_path`` (``env``: more
    environment variables, beside this process's)."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                env=None if env is None else {**os.environ, **env})


class ServerProcess:
    """A server subprocess; ``args`` are extra ``serve`` options (e.g. ``--config``).

    The admin HTTP and thrift ports are off (``--admin-port 0``, ``--thrift-port 0``) unless
    ``admin_port``/``thrift_port`` names one (``True``: a free one, kept across restarts), so
    that parallel servers never compete for the defaults 2223 and 2229. ``env``: environment
    variables the server gets beside the test's (an ``LD_PRELOAD``, say).
    """

    def __init__(self, data_dir: Path, args: tuple[str, ...] = (), port: int | None = None,
                 admin_port: int | bool | None = None, thrift_port: int | bool | None = None,
                 env: dict[str, str] | None = None):
        self.env = env
        self.host = "127.0.0.1"
        self.admin_host = "127.0.0.1"
        """Where the admin port listens (``--admin-host``, whose default this is): a test that
        passes another ``--admin-host`` sets it too."""
        self.port = port or free_port()
        self.admin_port = free_port() if admin_port is True else admin_port or None
        self.thrift_port = free_port() if thrift_port is True else thrift_port or None
        self.data_dir = Path(data_dir)
        self.args = tuple(args)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.data_dir.parent / f"server-{self.port}.log"

    def command(self) -> list[str]:
        # the text listener is on by default (port 2222); tests that want it name a free port
        text = () if "--text-port" in self.args else ("--text-port", "0")
        admin = () if "--admin-port" in self.args else ("--admin-port", str(self.admin_port or 0))
        thrift = () if "--thrift-port" in self.args else ("--thrift-port", str(self.thrift_port or 0))
        return [
            sys.executable, "-m", "kestrel_actors.cli", "serve",
            "--host", self.host, "--port", str(self.port), *text, *admin, *thrift,
            "--data-dir", str(self.data_dir), "--log-format", "json", *self.args,
        ]

    def start(self, timeout: float = 60.0, loaded: bool = True) -> ServerProcess:
        """Start the server and wait until every port listens and, with ``loaded``, until
        every queue found on disk is replayed (the ports open before: behaviour §7.1)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.proc = spawn_logged(self.command(), self.log_path, self.env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log()}")
            try:
                socket.create_connection((self.host, self.port), timeout=0.2).close()
                for host, other in ((self.admin_host, self.admin_port), (self.host, self.thrift_port)):
                    if other:  # listening by now, but be sure
                        socket.create_connection((host, other), timeout=0.2).close()
                if loaded:
                    self.wait_loaded(deadline - time.monotonic())
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"server did not listen within {timeout}s: {self.log()}")

    def wait_loaded(self, timeout: float) -> None:
        """Wait until memcache ``stats`` shows no queue still loading (``queue_<name>_loading``)."""
        deadline = time.monotonic() + max(timeout, 1.0)
        while time.monotonic() < deadline:
            with socket.create_connection((self.host, self.port), timeout=max(1.0, timeout)) as sock:
                sock.sendall(b"stats\r\n")
                reply = b""
                while not reply.endswith(b"END\r\n"):
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    reply += chunk
            if not re.search(rb"STAT queue_\S+_loading 1\r\n", reply) and reply.endswith(b"END\r\n"):
                return
            time.sleep(0.05)
        raise RuntimeError(f"the server's queues did not load within {timeout:.0f}s: {self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        code = self.proc.returncode
        self.proc = None
        return code

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def restart(self, sig: int = signal.SIGTERM) -> ServerProcess:
        self.stop(sig)
        return self.start()

    @property
    def address(self) -> str:
        """``host:port`` of the memcache listener, as :class:`kestrel_actors.client.Client`
        takes it."""
        return f"{self.host}:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://{self.admin_host}:{self.admin_port}"

    def log_events(self) -> list[dict]:
        """Every JSON line of the whole log, parsed (``log()`` keeps only the tail as text)."""
        events = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                pass
        return events

    def client(self, timeout: float = PATIENCE) -> Client:
        return Client(self.host, self.port, timeout)

    def thrift_client(self, timeout: float = PATIENCE):
        """A :class:`~kestrel_actors.client.thrift.ThriftClient` on the thrift port."""
        from kestrel_actors.client.thrift import ThriftClient

        assert self.thrift_port, "start the server with ServerProcess(..., thrift_port=True)"
        return ThriftClient(self.host, self.thrift_port, timeout)


def log_lines(server: ServerProcess) -> tuple[list[dict], list[str]]:
    """The server's log (``--log-format json``) as events, and every line that is not one (a
    traceback printed raw)."""
    events, raw = [], []
    for line in server.log_path.read_text(errors="replace").splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            raw.append(line)
    return events, raw


class Client(Connection):
    """A raw memcache-protocol connection for tests: send bytes, read exact replies.

    It is :class:`kestrel_actors.client.Connection` (plain blocking sockets) plus what tests
    want: the first reply line of a request, a SET's reply line, ``buffer`` as bytes, and
    whether the server closed the connection.
    """

    def __init__(self, host: str, port: int, timeout: float = PATIENCE) -> None:
        super().__init__(host, port, timeout, use_gevent=False)
        self.connect()

    @property
    def buffer(self) -> bytes:
        return bytes(self.buf)

    @buffer.setter
    def buffer(self, data: bytes) -> None:
        self.buf[:] = data

    def _fill(self) -> bool:
        """Receive one chunk into the buffer; False when the server closed the connection."""
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            return False
        self.buf += chunk
        return True

    def call(self, request: bytes) -> bytes:
        """Send one request line (the terminator added) and return the first reply line."""
        self.send(request + self.EOL)
        return self.read_line()

    def set(self, queue: str, data: bytes, exptime: int = 0) -> bytes:
        self.send(set_request(queue, data, exptime))
        return self.read_line()

    def get(self, key: str) -> bytes | None:
        """``get key``: the item's bytes, or None on ``END``."""
        self.send(b"get %s\r\n" % key.encode())
        return self.read_value(key.split("/", 1)[0].encode())

    def stats(self) -> dict[str, str]:
        self.send(b"stats\r\n")
        return self.read_stats()

    def is_closed(self, timeout: float = PATIENCE) -> bool:
        """True if the server closed the connection (nothing more arrives, EOF)."""
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False


# -- shared helpers ---------------------------------------------------------------------------

_ids = itertools.count(1)


def unique(prefix: str = "q") -> str:
    """A queue name no other test in this process uses (legal: no `.`, `/`, `~`)."""
    return f"{prefix}{next(_ids)}x{os.getpid()}"


def value(queue: str | bytes, data: bytes) -> bytes:
    """The exact bytes of a hit: ``VALUE <queue> 0 <len>\\r\\n<data>\\r\\nEND\\r\\n``."""
    if isinstance(queue, str):
        queue = queue.encode("latin-1")
    return b"VALUE %s 0 %d\r\n%s\r\nEND\r\n" % (queue, len(data), data)


def set_cmd(queue: str | bytes, data: bytes, flags: int = 0, exptime: int = 0) -> bytes:
    if isinstance(queue, str):
        queue = queue.encode("latin-1")
    return b"set %s %d %d %d\r\n%s\r\n" % (queue, flags, exptime, len(data), data)


def expect(client: Client, data: bytes) -> None:
    """The next bytes from the server are exactly ``data``."""
    try:
        got = client.read_exact(len(data))
    except ConnectionError as exc:
        raise AssertionError(f"expected {data[:200]!r}; {exc}") from None
    except TimeoutError:
        raise AssertionError(f"expected {data[:200]!r}; got {client.buffer[:200]!r} then silence") from None
    assert got == data


def drain(client: Client, idle: float = 2.0) -> tuple[bytes, bool]:
    """Everything the server sends until it closes (→ True) or stays silent ``idle`` s (→ False)."""
    data, client.buffer = client.buffer, b""
    client.sock.settimeout(idle)
    while True:
        try:
            chunk = client.sock.recv(1 << 20)
        except TimeoutError:
            return data, False
        except (ConnectionResetError, BrokenPipeError):
            return data, True
        if not chunk:
            return data, True
        data += chunk


def send_quietly(client: Client, data: bytes) -> None:
    """Send, tolerating a server that closes the connection while we are still writing."""
    try:
        client.send(data)
    except (BrokenPipeError, ConnectionResetError):
        pass


def assert_dropped(client: Client) -> None:
    """DROP: the server closes the connection without writing anything."""
    assert drain(client, PATIENCE) == (b"", True)


def assert_reply_then_close(client: Client, reply: bytes) -> None:
    """The server writes exactly ``reply`` and then closes the connection."""
    assert drain(client, PATIENCE) == (reply, True)


def assert_still_open(client: Client) -> None:
    """The connection still answers: ``version`` → ``VERSION …``."""
    client.send(b"version\r\n")
    assert re.fullmatch(rb"VERSION \S+", client.read_line())


def assert_silent(client: Client, seconds: float) -> None:
    """Nothing arrives for ``seconds`` and the connection is still open."""
    data, closed = drain(client, seconds)
    assert (data, closed) == (b"", False)
    client.sock.settimeout(client.timeout)


def stats_of(server: ServerProcess) -> dict[str, str]:
    client = server.client()
    try:
        return client.stats()
    finally:
        client.close()


def queue_stat(server: ServerProcess, queue: str, stat: str) -> str | None:
    return stats_of(server).get(f"queue_{queue}_{stat}")


def wait_for(predicate, timeout: float = PATIENCE, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def wait_queue_stat(server: ServerProcess, queue: str, stat: str, expected: str, timeout: float = PATIENCE) -> None:
    """Poll STATS until ``queue_<queue>_<stat>`` is ``expected`` (asynchronous effects of a close)."""
    ok = wait_for(lambda: queue_stat(server, queue, stat) == expected, timeout)
    assert ok, f"queue_{queue}_{stat} = {queue_stat(server, queue, stat)!r}, wanted {expected!r}"


def drain_queue(server: ServerProcess, queue: str) -> list[bytes]:
    """All items still in ``queue``, read with plain GETs on a new connection."""
    client = server.client()
    items = []
    try:
        while (item := client.get(queue)) is not None:
            items.append(item)
    finally:
        client.close()
    return items


def fill(client: Client, queue: str, *items: bytes) -> None:
    client.send(b"".join(set_cmd(queue, item) for item in items))
    for _ in items:
        assert client.read_line() == b"STORED"


# -- behaviour §10.1 FIFO, wire format and binary payloads ---------------------------------------------


# -- the text protocol -------------------------------------------------------------------------


class TextClient(Client):
    """A raw text-protocol client: reply lines end in a bare ``\\n``."""

    EOL = b"\n"

    def read_line(self) -> bytes:
        line = super().read_line()
        assert not line.endswith(b"\r"), line
        return line

    def put(self, queue: str, *items: bytes, expiry: int | None = None) -> bytes:
        head = b"put " + queue.encode()
        if expiry is not None:
            head += b" %d" % expiry
        self.send(head + b":\n" + b"".join(item + b"\n" for item in items) + b"\n")
        return self.read_line()

    def silent(self, timeout: float = 0.3) -> bool:
        """Nothing more arrives within ``timeout`` (and the connection is still open)."""
        if self.buffer:
            return False
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(1)
        except TimeoutError:
            return True
        finally:
            self.sock.settimeout(self.timeout)
        self.buffer += data
        return False


def start_text_server(data_dir, *args: str) -> ServerProcess:
    text_port = free_port()
    server = ServerProcess(data_dir, ("--text-port", str(text_port), *args))
    server.text_port = text_port  # type: ignore[attr-defined]
    return server.start()


def text_client(server: ServerProcess) -> TextClient:
    return TextClient(server.host, server.text_port)  # type: ignore[attr-defined]


# -- journal files and restarts ----------------------------------------------------------------------------------


@contextlib.contextmanager
def mounted_tmpfs(mount_point: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted at ``mount_point`` (made here) for the block, lazily unmounted after it.
    The calling test skips, saying why, if mounting is refused (it needs root)."""
    import pytest

    mount_point.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount_point)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


def write_config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "kestrel.toml"
    path.write_text(text)
    return str(path)


def queue_files(data_dir: Path, name: str) -> list[str]:
    """Every file of queue ``name`` in ``data_dir`` (current, archives, packs, temp files)."""
    return sorted(
        f for f in os.listdir(data_dir)
        if f == name or f.startswith((name + ".", name + "~~"))
    )


def files_size(data_dir: Path, name: str) -> int:
    """Bytes in the queue's journal files (not temp files); tolerates the server renaming them."""
    total = 0
    for filename in queue_files(data_dir, name):
        if "~~" not in filename:
            try:
                total += os.path.getsize(data_dir / filename)
            except FileNotFoundError:
                pass
    return total


def stat(client: Client, queue: str, name: str) -> int:
    return int(client.stats()[f"queue_{queue}_{name}"])


def drain_pipelined(server: ServerProcess, queue: str) -> list[bytes]:
    """Every item of ``queue`` (pipelined plain GETs), checking that the queue ends empty."""
    client = server.client()
    count = stat(client, queue, "items")
    client.close()
    pipe = Pipeline(server.host, server.port)
    values = pipe.get_all(queue, count + 1)
    pipe.close()
    assert values[-1] is None, f"more than the {count} items STATS reported"
    assert None not in values[:-1], f"a GET missed although STATS reported {count} items"
    return values[:-1]  # type: ignore[return-value]


def assert_numbered(
    values: list[bytes], expected: range | list[int], tag: bytes = b"", size: int | None = None,
) -> None:
    """``values`` are exactly the :func:`numbered` items ``expected``, in order."""
    got = [number_of(v, tag) for v in values]
    expected = list(expected)
    if got != expected:
        index = next((i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b),
                     min(len(got), len(expected)))
        raise AssertionError(
            f"{len(got)} items, expected {len(expected)}; first difference at index {index}: "
            f"got {got[index:index + 5]}, expected {expected[index:index + 5]}"
        )
    if size is not None:
        assert all(len(v) == size for v in values)


# -- deeply pipelined traffic (durability, read-behind) ------------------------------------------


def numbered(i: int, size: int = 1024, tag: bytes = b"") -> bytes:
    """Item ``i`` of a sequence: ``<tag><i, 10 digits>:`` padded with ``.`` to ``size`` bytes."""
    head = b"%s%010d:" % (tag, i)
    return head + b"." * (size - len(head))


def number_of(data: bytes, tag: bytes = b"") -> int:
    """The ``i`` of :func:`numbered` data (asserts the tag)."""
    assert data.startswith(tag), data[:40]
    return int(data[len(tag):len(tag) + 10])


def write_queue_journals(data_dir: Path, count: int, prefix: str = "q", data: bytes = b"x") -> list[str]:
    """Journal files of ``count`` queues ``<prefix>0`` … in ``data_dir``, each holding one item
    ``data``: what a server with that many queues leaves behind, made in a moment."""
    from kestrel_actors.journal import Item, encode_add

    data_dir.mkdir(parents=True, exist_ok=True)
    record = encode_add(Item(data, int(time.time() * 1000)))
    names = [f"{prefix}{i}" for i in range(count)]
    for name in names:
        (data_dir / name).write_bytes(record)
    return names


def process_cpu_seconds(pid: int) -> float:
    """CPU time ``pid`` has used (user and system, every thread), from ``/proc/<pid>/stat``."""
    with open(f"/proc/{pid}/stat") as stat_file:
        fields = stat_file.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def read_rss_kib(pid: int) -> int:
    """VmRSS of ``pid`` in KiB, from ``/proc/<pid>/status``."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def server_rss(server: ServerProcess) -> int:
    """The server process's resident set in bytes."""
    return read_rss_kib(server.proc.pid) * 1024


def settled_rss(server: ServerProcess, ceiling: int, timeout: float = 15.0) -> int:
    """The server's resident set (bytes) once it is at most ``ceiling``, or after ``timeout``."""
    wait_for(lambda: server_rss(server) <= ceiling, timeout, 0.1)
    return server_rss(server)


class Pipeline(Connection):
    """One memcache connection (:class:`kestrel_actors.client.Connection`, blocking sockets):
    :meth:`stream` sends from a thread while the ``read_*`` methods parse the replies."""

    def __init__(self, host: str, port: int, timeout: float = 60.0) -> None:
        super().__init__(host, port, timeout, use_gevent=False)
        self.connect()
        self._sender: threading.Thread | None = None
        self.send_error: BaseException | None = None

    # -- sending --------------------------------------------------------------------------

    def stream(self, chunks: Iterable[bytes]) -> None:
        """Send ``chunks`` from a background thread (replies are read meanwhile)."""
        self.wait_sent()
        sock = self.sock

        def send() -> None:
            try:
                for chunk in chunks:
                    sock.sendall(chunk)
            except BaseException as exc:  # noqa: BLE001 - reported by wait_sent
                self.send_error = exc

        self._sender = threading.Thread(target=send, daemon=True)
        self._sender.start()

    def wait_sent(self, timeout: float = 120.0) -> None:
        if self._sender is not None:
            self._sender.join(timeout)
            assert not self._sender.is_alive(), "sender stuck"
            self._sender = None
        if self.send_error is not None:
            raise self.send_error

    def stream_sets(self, queue: str, items: Iterable[bytes], batch: int = 1000) -> None:
        """Stream ``set queue 0 0 <len>`` for every item, ``batch`` requests per ``sendall``."""
        self.stream(_batches((set_request(queue, data) for data in items), batch))

    def stream_gets(self, key: str, count: int, batch: int = 1000) -> None:
        """Stream ``count`` times ``get key``."""
        request = b"get %s\r\n" % key.encode()
        self.stream(request * min(batch, count - start) for start in range(0, count, batch))

    # -- receiving ------------------------------------------------------------------------

    def read_replies(self, count: int) -> Iterator[bytes | None]:
        for _ in range(count):
            yield self.read_value()

    def expect_stored(self, count: int) -> None:
        for i in range(count):
            line = self.read_line()
            assert line == b"STORED", f"reply {i}: {line[:100]!r}"

    def set_all(self, queue: str, items: list[bytes], batch: int = 1000) -> None:
        """SET every item, pipelined; every reply must be ``STORED``."""
        self.stream_sets(queue, items, batch)
        self.expect_stored(len(items))
        self.wait_sent()

    def get_all(self, queue: str, count: int, batch: int = 1000) -> list[bytes | None]:
        """``count`` pipelined GETs; the replies (None for a miss)."""
        self.stream_gets(queue, count, batch)
        values = list(self.read_replies(count))
        self.wait_sent()
        return values


def create_queues(server: ServerProcess, names: Iterable[str], data: bytes = b"x") -> int:
    """One item in each queue named (so each exists), in one pipelined burst; how many."""
    requests = [set_request(name, data) for name in names]
    pipe = Pipeline(server.host, server.port)
    try:
        pipe.stream([b"".join(requests)])
        pipe.expect_stored(len(requests))
        pipe.wait_sent()
    finally:
        pipe.close()
    return len(requests)


def _batches(requests: Iterable[bytes], size: int) -> Iterator[bytes]:
    batch: list[bytes] = []
    for request in requests:
        batch.append(request)
        if len(batch) >= size:
            yield b"".join(batch)
            batch = []
    if batch:
        yield b"".join(batch)


# -- the admin HTTP port (the standard library's client) -------------------------------------


class Response(NamedTuple):
    status: int
    content_type: str
    body: bytes
    headers: dict[str, str] | None = None
    """Every header of the reply, by lower-case name."""

    def json(self) -> Any:
        return json.loads(self.body)


def request(url: str, method: str = "GET", timeout: float = 10.0, headers: dict[str, str] | None = None) -> Response:
    """One request as ``curl`` makes it: no ``Origin``, no ``Sec-Fetch-*``, the ``Host`` dialled
    (unless ``headers`` says otherwise)."""
    req = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as reply:
            return Response(reply.status, reply.headers.get("Content-Type", ""), reply.read(),
                            {name.lower(): value for name, value in reply.headers.items()})
    except urllib.error.HTTPError as error:
        return Response(error.code, error.headers.get("Content-Type", ""), error.read(),
                        {name.lower(): value for name, value in error.headers.items()})


def get_json(url: str) -> Any:
    response = request(url)
    assert response.status == 200, response
    assert response.content_type == "application/json", response.content_type
    return response.json()


def act(url: str, token: str | None = None) -> Response:
    """POST to an admin endpoint that acts, as a script on the machine does (ADR 0019): with the
    header ``X-Kestrel-Admin``, or with ``Authorization: Bearer`` when the port has a token."""
    header = {"X-Kestrel-Admin": "1"} if token is None else {"Authorization": f"Bearer {token}"}
    return request(url, method="POST", headers=header)


def act_json(url: str, token: str | None = None) -> Any:
    """:func:`act`, which must answer 200 with JSON."""
    response = act(url, token)
    assert response.status == 200, response
    return response.json()


# -- ZooKeeper --------------------------------------------------------------------------------

ZOOKEEPER_CLASSPATH = "/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-nop.jar"
"""Debian's ``zookeeper`` package (``make zookeeper``): its jar names its dependencies."""


class ZooKeeperProcess:
    """A standalone ZooKeeper (Debian's 3.8) on a free loopback port with its own data
    directory; stopped (or killed) by its pid. ``tickTime`` is 500 ms, so sessions may be as
    short as one second."""

    def __init__(self, directory: Path, port: int | None = None) -> None:
        self.directory = Path(directory)
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> ZooKeeperProcess:
        data = self.directory / "data"
        data.mkdir(parents=True, exist_ok=True)
        config = self.directory / "zoo.cfg"
        config.write_text(
            f"tickTime=500\ndataDir={data}\nclientPort={self.port}\nclientPortAddress=127.0.0.1\n"
            "admin.enableServer=false\n4lw.commands.whitelist=ruok\nminSessionTimeout=1000\n"
            # no fsync of ZooKeeper's own log: in a full test run other tests' fsyncs stalled
            # it for seconds, and its clients timed out (nothing here outlives the test)
            "maxSessionTimeout=60000\nforceSync=no\n"
        )
        self.proc = spawn_logged(["java", "-Xmx256m", "-cp", ZOOKEEPER_CLASSPATH,
                                  "org.apache.zookeeper.server.quorum.QuorumPeerMain", str(config)],
                                 self.directory / "zookeeper.log")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"zookeeper exited with {self.proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    sock.sendall(b"ruok")
                    if sock.recv(4) == b"imok":
                        return self
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"zookeeper did not answer ruok within {timeout}s")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kazoo(self, **options: Any):
        """A started kazoo client of this ZooKeeper (threads); the caller stops it."""
        from kazoo.client import KazooClient

        client = KazooClient(self.hosts, **options)
        client.start(30)
        return client


def server_set_ports(zk, path: str) -> set[int]:
    """The memcache ports of the ALIVE members of the server set at ``path`` (read with the
    kazoo client ``zk``); none while the set does not exist."""
    if zk.exists(path) is None:
        return set()
    found = set()
    for child in zk.get_children(path):
        try:
            data, _ = zk.get(f"{path}/{child}")
        except Exception:  # noqa: BLE001 - it left meanwhile
            continue
        member = json.loads(data)
        if member["status"] == "ALIVE":
            found.add(member["additionalEndpoints"]["memcache"]["port"])
    return found


# -- in process: real actors, no sockets -------------------------------------------------------


class BufferTransport(Transport):
    """Stands for a client socket's transport: what the session sends is kept."""

    def __init__(self) -> None:
        super().__init__()
        self.sent = b""
        self.closed = False

    def sendall(self, data: bytes) -> None:
        self.sent += data

    def resume(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def take(self) -> bytes:
        sent, self.sent = self.sent, b""
        return sent


class Control:
    """The server as a session sees it: records what it is told."""

    def __init__(self) -> None:
        self.told: list = []

    def tell(self, message) -> None:
        self.told.append(message)
        if type(message) is Reload:
            message.reply_to.tell(True)


class World:
    """A server without sockets: one queue collection (memory journals unless ``opener`` says
    otherwise) and the context its sessions share; :meth:`connect` opens a session."""

    def __init__(self, tmp_path, opener=None, **config) -> None:
        config = ServerConfig(data_dir=str(tmp_path), **config)
        self.config = config
        self.stats = ServerStats()
        self.queues: dict = {}
        self.collection = QueueCollection.start(config, self.stats, opener or memory_opener, self.queues)
        self.control = Control()
        self.finished: list[Session] = []
        self.context = SessionContext(
            stats=self.stats, status=ServerStatus.from_config(config), collection=self.collection,
            config=config, version="test", control=self.control, closed=self.finished.append,
            queues=self.queues,
        )
        self.next_id = 0

    def connect(self, handler=MemcacheHandler, transport: BufferTransport | None = None) -> SessionClient:
        self.next_id += 1
        return SessionClient(self, handler, self.next_id, transport)


class SessionClient:
    """One connection in process: a real session actor over a :class:`BufferTransport`."""

    def __init__(self, world: World, handler, number: int, transport: BufferTransport | None = None) -> None:
        self.transport = transport or BufferTransport()
        self.session = Session(number, "in-process")
        self.decoder = MemcacheDecoder() if issubclass(handler, MemcacheHandler) else TextDecoder(1024)
        self.ref = SessionActor.start(world.context, self.transport, self.session, handler)

    def send(self, data: bytes) -> bytes:
        Dispatcher.current().deliver(self.ref, Received(self.decoder.feed(data)))
        settle()
        return self.transport.take()

    def hang_up(self) -> None:
        Dispatcher.current().deliver(self.ref, Disconnected())
        settle()

    def drain(self) -> bytes:
        """What the server's shutdown tells every session before the queues close."""
        Dispatcher.current().deliver(self.ref, Drain())
        settle()
        return self.transport.take()


def settle() -> None:
    """Let the dispatcher, the queues' held answers and the sessions run to quiet."""
    dispatcher = Dispatcher.current()
    for _ in range(100):
        gevent.sleep(0.001)
        if not dispatcher.due and not dispatcher.running:
            gevent.sleep(0.001)
            return


def resolve_queue(collection: Any, name: str) -> Any:
    """The ref of queue ``name``'s actor, asked of ``collection`` (created if need be)."""
    reply = ReplyFuture()
    collection.tell(Resolve(name, True, reply))
    return reply.get(timeout=PATIENCE).ref


def batch_reply(ref: Any, *ops: Any, session: Any = None) -> ReplyFuture:
    """Tell a queue's actor one batch; its reply, not waited for (a fetch may park)."""
    reply = ReplyFuture()
    ref.tell(QueueBatch(list(ops), session, reply))
    return reply


def run_batch(ref: Any, *ops: Any, session: Any = None) -> list[Any]:
    """Tell a queue's actor one batch and wait for its results, one per operation."""
    return batch_reply(ref, *ops, session=session).get(timeout=PATIENCE).results
