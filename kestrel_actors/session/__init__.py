"""One client's session: the protocol-neutral session actor, its protocol handlers, its wiring.

* :class:`SessionActor` (``_actor``): request order, batches to queues, open reads, waits,
  monitor streams and hang-up, for any protocol.
* :class:`MemcacheHandler` (``_memcache``), :class:`TextHandler` (``_text``),
  :class:`ThriftHandler` (``_thrift``, with its process-global open reads in
  ``_thrift_reads``): one protocol each, composed into the session (subclasses of the
  :class:`Handler` of ``_handler``, which also declares :class:`HandlerSession`: what a
  handler may ask of its session).
* :class:`SessionContext` (``_context``): what a session may ask of the server.
* :class:`Connections` (``_connections``): a socket, a transport and a session, wired up
  (a listener's accept loop, :func:`accept_burst`, hands each client to an :class:`Acceptor`);
  a session sends through a :class:`Transport` (``_transport``); the socket transports tell
  the server-wide ``BufferBudget`` (``_budget``) what they buffer, bounded by
  ``max_buffered_bytes``; after their reads a hub polls before it sleeps (:class:`BusyPoll`,
  ``busy_poll``).
"""

from ._actor import Disconnected, Drain, EndOfInput, MonitorState, Received, SessionActor
from ._connections import Acceptor, Connections, accept_burst
from ._context import Reload, SessionContext, Shutdown
from ._handler import Answer, Handler
from ._memcache import MemcacheHandler
from ._text import TextHandler
from ._thrift import ThriftHandler
from ._transport import CLIENT_SOCKET_OPTIONS, LIGHT_FIRST_READ, BusyPoll, Transport, first_read_bytes

__all__ = [
    "CLIENT_SOCKET_OPTIONS", "LIGHT_FIRST_READ", "Acceptor", "Answer", "BusyPoll", "Connections", "Disconnected",
    "Drain", "EndOfInput", "Handler", "MemcacheHandler", "MonitorState", "Received", "Reload", "SessionActor",
    "SessionContext", "Shutdown", "TextHandler", "ThriftHandler", "Transport", "accept_burst", "first_read_bytes",
]
