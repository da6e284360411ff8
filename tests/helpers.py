"""Run a real ``kestrel-actors serve`` process for a test, and talk to it over a socket.

Tests never mock the server: they start this process on a free loopback port with a data
directory in a temp dir, and may stop it with SIGTERM or SIGKILL and start it again on the
same port and data directory.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from kestrel_actors.client import Connection, set_request

__all__ = ["Client", "ServerProcess", "free_port"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """A server subprocess; ``args`` are extra ``serve`` options (e.g. ``--config``).

    The admin HTTP and thrift ports are off (``--admin-port 0``, ``--thrift-port 0``) unless
    ``admin_port``/``thrift_port`` names one (``True``: a free one, kept across restarts), so
    that parallel servers never compete for the defaults 2223 and 2229.
    """

    def __init__(self, data_dir: Path, args: tuple[str, ...] = (), port: int | None = None,
                 admin_port: int | bool | None = None, thrift_port: int | bool | None = None):
        self.host = "127.0.0.1"
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

    def start(self, timeout: float = 20.0) -> ServerProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log()}")
            try:
                socket.create_connection((self.host, self.port), timeout=0.2).close()
                for other in (self.admin_port, self.thrift_port):  # listening by now, but be sure
                    if other:
                        socket.create_connection((self.host, other), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"server did not listen within {timeout}s: {self.log()}")

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
        return f"http://{self.host}:{self.admin_port}"

    def client(self, timeout: float = 5.0) -> Client:
        return Client(self.host, self.port, timeout)

    def thrift_client(self, timeout: float = 5.0):
        """A :class:`~kestrel_actors.thrift_client.ThriftClient` on the thrift port."""
        from kestrel_actors.thrift_client import ThriftClient

        assert self.thrift_port, "start the server with ServerProcess(..., thrift_port=True)"
        return ThriftClient(self.host, self.thrift_port, timeout)


class Client(Connection):
    """A raw memcache-protocol connection for tests: send bytes, read exact replies.

    It is :class:`kestrel_actors.client.Connection` (plain blocking sockets) plus what tests
    want: the first reply line of a request, a SET's reply line, ``buffer`` as bytes, and
    whether the server closed the connection.
    """

    def __init__(self, host: str, port: int, timeout: float = 5.0) -> None:
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

    def is_closed(self, timeout: float = 2.0) -> bool:
        """True if the server closed the connection (nothing more arrives, EOF)."""
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True
        except socket.timeout:
            return False
