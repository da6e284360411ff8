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

__all__ = ["Client", "ServerProcess", "free_port"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """A server subprocess; ``args`` are extra ``serve`` options (e.g. ``--config``)."""

    def __init__(self, data_dir: Path, args: tuple[str, ...] = (), port: int | None = None,
                 thrift: bool = False):
        self.host = "127.0.0.1"
        self.port = port or free_port()
        self.thrift_port = free_port() if thrift else None
        """With ``thrift``: the thrift listener's port (kept across restarts)."""
        self.data_dir = Path(data_dir)
        self.args = tuple(args)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.data_dir.parent / f"server-{self.port}.log"

    def command(self) -> list[str]:
        # the text and thrift listeners are on by default (ports 2222, 2229); tests that want
        # one name a free port (``thrift_port``)
        text = () if "--text-port" in self.args else ("--text-port", "0")
        thrift = ("--thrift-port", str(self.thrift_port or 0)) if "--thrift-port" not in self.args else ()
        return [
            sys.executable, "-m", "kestrel_actors.cli", "serve",
            "--host", self.host, "--port", str(self.port), *text, *thrift,
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
                for port in (self.port, self.thrift_port):
                    if port:
                        socket.create_connection((self.host, port), timeout=0.2).close()
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

    def client(self, timeout: float = 5.0) -> Client:
        return Client(self.host, self.port, timeout)

    def thrift_client(self, timeout: float = 5.0):
        """A :class:`~kestrel_actors.thrift_client.ThriftClient` on the thrift port."""
        from kestrel_actors.thrift_client import ThriftClient

        assert self.thrift_port, "start the server with ServerProcess(..., thrift=True)"
        return ThriftClient(self.host, self.thrift_port, timeout)


class Client:
    """A raw memcache-protocol client that sends bytes and reads exact replies."""

    EOL = b"\r\n"

    def __init__(self, host: str, port: int, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> bool:
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            return False
        self.buffer += chunk
        return True

    def read_line(self) -> bytes:
        while self.EOL not in self.buffer:
            if not self._fill():
                raise ConnectionError(f"closed; buffered {self.buffer!r}")
        line, _, self.buffer = self.buffer.partition(self.EOL)
        return line

    def read_exact(self, n: int) -> bytes:
        while len(self.buffer) < n:
            if not self._fill():
                raise ConnectionError(f"closed; buffered {self.buffer!r}")
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def call(self, request: bytes) -> bytes:
        """Send one request line (the terminator added) and return the first reply line."""
        self.send(request + self.EOL)
        return self.read_line()

    def set(self, queue: str, data: bytes, exptime: int = 0) -> bytes:
        self.send(b"set %s 0 %d %d\r\n%s\r\n" % (queue.encode(), exptime, len(data), data))
        return self.read_line()

    def get(self, key: str) -> bytes | None:
        """``get key``: the item's bytes, or None on ``END``."""
        self.send(b"get %s\r\n" % key.encode())
        return self.read_value()

    def read_value(self) -> bytes | None:
        line = self.read_line()
        if line == b"END":
            return None
        if not line.startswith(b"VALUE "):
            raise AssertionError(f"unexpected reply {line!r}")
        length = int(line.split()[3])
        data = self.read_exact(length + 2)[:-2]
        end = self.read_line()
        assert end == b"END", end
        return data

    def stats(self) -> dict[str, str]:
        self.send(b"stats\r\n")
        result = {}
        while True:
            line = self.read_line()
            if line == b"END":
                return result
            _stat, name, value = line.decode("latin-1").split(" ", 2)
            result[name] = value

    def is_closed(self, timeout: float = 2.0) -> bool:
        """True if the server closed the connection (nothing more arrives, EOF)."""
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True
        except socket.timeout:
            return False

    def close(self) -> None:
        self.sock.close()
