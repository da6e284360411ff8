"""A Python client for Kestrel servers (and kestrel-actors), alone or as a pool.

::

    from kestrel_actors.client import Client

    with Client(["10.0.0.1:22133", "10.0.0.2:22133"]) as client:
        client.put("jobs", b"hello")                 # True once STORED (journalled)
        client.put_many("jobs", [b"a", b"b"])        # pipelined; how many were STORED
        client.get("jobs", timeout=2.0)              # b"hello", or None after 2 s
        with client.reliable("jobs", timeout=1.0) as item:
            handle(item)                             # confirmed if this returns, back at the
                                                     # head of the queue if it raises
        with client.monitor("jobs", 1, 100) as batch:
            handle_all(batch.items)                  # confirmed together

Queues are named by plain names; waits are in seconds. Every error is a
:class:`KestrelError`: :class:`ClientError` (``ERROR``/``CLIENT_ERROR``),
:class:`ServerError` (``SERVER_ERROR`` or a reply out of step: :class:`UnexpectedReply`) or
:class:`ConnectionLost` (:class:`ConnectFailed`, :class:`ReplyTimeout`). :class:`Connection`
is the raw connection underneath, for callers that write their own request bytes; the
builders and parsers of :mod:`._wire` are pure functions.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_face

if TYPE_CHECKING:
    from ._address import ServerAddress
    from ._client import Client, MonitorBatch
    from ._connection import Connection, cooperative
    from ._errors import (
        ClientError,
        ConnectFailed,
        ConnectionLost,
        KestrelError,
        ReplyTimeout,
        ServerError,
        UnexpectedReply,
        reply_error,
    )
    from ._wire import (
        END,
        STORED,
        PackedValues,
        confirm_request,
        get_options,
        get_reply_size,
        get_request,
        monitor_request,
        parse_version,
        queue_key,
        set_request,
        value_reply,
    )

# Each name's private module, imported on first use: a Spark source's short-lived processes
# parse a server address and nothing else of the client (ADR 0022).
_HOMES = {
    "ServerAddress": "._address",
    "Client": "._client", "MonitorBatch": "._client",
    "Connection": "._connection", "cooperative": "._connection",
    **dict.fromkeys(("ClientError", "ConnectFailed", "ConnectionLost", "KestrelError", "ReplyTimeout",
                     "ServerError", "UnexpectedReply", "reply_error"), "._errors"),
    **dict.fromkeys(("END", "STORED", "PackedValues", "confirm_request", "get_options", "get_reply_size",
                     "get_request", "monitor_request", "parse_version", "queue_key", "set_request",
                     "value_reply"), "._wire"),
}

__all__ = [
    "END",
    "STORED",
    "Client",
    "ClientError",
    "ConnectFailed",
    "Connection",
    "ConnectionLost",
    "KestrelError",
    "MonitorBatch",
    "PackedValues",
    "ReplyTimeout",
    "ServerAddress",
    "ServerError",
    "UnexpectedReply",
    "confirm_request",
    "cooperative",
    "get_options",
    "get_reply_size",
    "get_request",
    "monitor_request",
    "parse_version",
    "queue_key",
    "reply_error",
    "set_request",
    "value_reply",
]


__getattr__, __dir__ = lazy_face(__name__, globals(), _HOMES, __all__)
