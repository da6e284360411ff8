"""How a load run tells a verdict on the server from a failure of the run itself.

The run talks through :class:`kestrel_actors.client.Connection`. Bytes other than the ones
required, or a connection the server closed where a reply was due, are correctness failures
(exit 1); no connection, a reply that never came, or any other OS error are harness errors
(exit 3), as is :class:`HarnessError` raised by the run's own steps.
"""

from __future__ import annotations

import ipaddress
import socket

from kestrel_actors.client import ConnectFailed, KestrelError, ReplyTimeout

__all__ = ["CONNECT_ATTEMPTS", "HarnessError", "check_loopback", "is_failure", "is_harness_error"]

CONNECT_ATTEMPTS = 1000
"""Connection attempts 10 ms apart before a client gives up (Kestrel's ``tryHard``)."""


class HarnessError(Exception):
    """The run could not be carried out: not a verdict on the server."""


def is_failure(exc: BaseException) -> bool:
    """A correctness failure of the server (the client read what it must not)."""
    return isinstance(exc, KestrelError) and not isinstance(exc, ConnectFailed | ReplyTimeout)


def is_harness_error(exc: BaseException) -> bool:
    """The run could not go on, through no proven fault of the server."""
    return not is_failure(exc) and isinstance(exc, HarnessError | KestrelError | OSError)


def check_loopback(host: str) -> None:
    """Refuse (HarnessError) to aim load at anything but a loopback address."""
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError as exc:
        raise HarnessError(f"cannot resolve {host!r}: {exc}") from exc
    for info in infos:
        if not ipaddress.ip_address(info[4][0]).is_loopback:
            raise HarnessError(f"{host} is not a loopback address; pass --allow-remote to load it")
