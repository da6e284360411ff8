"""The client's exceptions, and the one place a reply line becomes one of them.

Every failure is a :class:`KestrelError`. A connection that raised one is closed and never
reused (its position in the reply stream is unknown), so the server puts that connection's
open reads back at the head of their queues (behaviour §2.6).
"""

from __future__ import annotations

__all__ = [
    "ClientError",
    "ConnectFailed",
    "ConnectionLost",
    "KestrelError",
    "ReplyTimeout",
    "ServerError",
    "UnexpectedReply",
    "reply_error",
]


class KestrelError(Exception):
    """Any failure talking to a Kestrel server."""


class ClientError(KestrelError):
    """The server refused the request: ``ERROR`` or ``CLIENT_ERROR`` (e.g. confirming more
    items than are open, a plain get while a reliable read is open, an option mix Kestrel
    rejects)."""

    def __init__(self, command: str, reply: bytes) -> None:
        super().__init__(f"{command}: server replied {reply[:200]!r}")
        self.command = command
        self.reply = reply


class ServerError(KestrelError):
    """The server could not serve the request: ``SERVER_ERROR`` (reads or writes blocked by
    the server's status), or a reply this client cannot make sense of."""

    def __init__(self, command: str, reply: bytes = b"", message: str | None = None) -> None:
        super().__init__(message or f"{command}: server replied {reply[:200]!r}")
        self.command = command
        self.reply = reply


class UnexpectedReply(ServerError):
    """Bytes that no reply to this request may contain (the stream is out of step)."""

    def __init__(self, message: str) -> None:
        super().__init__("read", message=message)


class ConnectionLost(KestrelError, ConnectionError):
    """No connection could be made, or it was closed or reset, or a reply did not come in
    time. Open reliable reads of that connection go back to their queue on the server."""


class ConnectFailed(ConnectionLost):
    """The server did not accept a connection."""


class ReplyTimeout(ConnectionLost, TimeoutError):
    """No reply within the socket timeout (for a blocking read: its wait plus the margin)."""


_REFUSALS = {b"ERROR": ClientError, b"CLIENT_ERROR": ClientError, b"SERVER_ERROR": ServerError}


def reply_error(command: str, line: bytes) -> KestrelError:
    """The exception for reply ``line`` to ``command`` when it is not the success reply.

    Kestrel never adds text to its error lines (behaviour §2.2), but other servers do, so
    only the first word is matched.
    """
    kind = _REFUSALS.get(line.split(b" ", 1)[0])
    if kind is not None:
        return kind(command, line)
    return UnexpectedReply(f"{command}: unexpected reply {line[:200]!r}")
