"""systemd's service notifications (``Type=notify``, sd_notify(3)): the server says when it is
ready, when it reloads and when it stops.

The protocol is one datagram of ``NAME=value`` lines to the ``AF_UNIX`` socket named by
``$NOTIFY_SOCKET`` (an abstract one when the name starts with ``@``). It is written here, in a
few lines of ``socket``, rather than taken from a library, for one ``sendto``: the pure-Python
``sdnotify`` has had no release since 2017 (``sd-notify`` since 2020), and ``systemd-python``
and ``cysystemd`` compile against libsystemd's headers, which a plain ``pip install`` on a
fresh machine does not have. Without ``$NOTIFY_SOCKET`` (not under systemd) every call does
nothing; a failure to send is logged once and never stops the server.

What the server sends, and when (:class:`~kestrel_actors.server.Server`):

* ``READY=1`` once every listener is up and every journal replayed;
* ``RELOADING=1`` with ``MONOTONIC_USEC`` (which ``Type=notify-reload`` needs, systemd ≥ 253)
  when a reload begins (SIGHUP, memcache ``reload``, ``/reload``), and ``READY=1`` once every
  queue has its new settings, or the reload failed and the running configuration stays;
* ``STOPPING=1`` when it begins to shut down (or to quiesce).
"""

from __future__ import annotations

import os
import socket
import time

import structlog

__all__ = ["ServiceNotifier"]

log = structlog.get_logger("kestrel_actors.service")


class ServiceNotifier:
    """Sends notifications to the service manager at ``address`` (``$NOTIFY_SOCKET``)."""

    def __init__(self, address: str | None) -> None:
        self._address: str | bytes | None = None
        if address:
            # an abstract socket's name begins with a NUL byte, which an environment variable
            # cannot hold: systemd writes it as "@"
            self._address = "\0" + address[1:] if address.startswith("@") else address
        self._socket: socket.socket | None = None
        self._failed = False

    @classmethod
    def from_environment(cls) -> ServiceNotifier:
        return cls(os.environ.get("NOTIFY_SOCKET"))

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def ready(self) -> None:
        self.send("READY=1", f"MAINPID={os.getpid()}")

    def reloading(self) -> None:
        self.send("RELOADING=1", f"MONOTONIC_USEC={time.monotonic_ns() // 1000}")

    def stopping(self) -> None:
        self.send("STOPPING=1")

    def send(self, *assignments: str) -> None:
        """One datagram of ``assignments``, one a line; nothing without a socket to send to."""
        if self._address is None:
            return
        try:
            if self._socket is None:
                self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                # a datagram to a full socket would wait: the manager missing one is better
                # than the hub stopping for it
                self._socket.setblocking(False)
            self._socket.sendto("\n".join(assignments).encode(), self._address)
        except OSError as exc:
            if not self._failed:
                self._failed = True
                log.warning("cannot notify the service manager", socket=os.environ.get("NOTIFY_SOCKET"),
                            error=str(exc))

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None
