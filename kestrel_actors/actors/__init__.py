"""Actors on a gevent runtime for pykka: queues, connections and the queue collection."""

from ._collection import QueueCollection, validate_queue_name
from ._connection import ConnectionActor, Disconnected, Received
from ._messages import BatchDone, QueueBatch, Session
from ._queue import QueueActor
from ._queue_core import QueueCore, expiry_from_exptime
from ._dispatcher import Dispatcher
from ._runtime import GeventActor, GeventFuture, ReplyFuture
from ._session import SessionActor
from ._stats import ServerStats
from ._text_connection import TextConnectionActor

__all__ = [
    "BatchDone",
    "ConnectionActor",
    "Disconnected",
    "Dispatcher",
    "GeventActor",
    "GeventFuture",
    "QueueActor",
    "QueueBatch",
    "QueueCollection",
    "QueueCore",
    "Received",
    "ReplyFuture",
    "ServerStats",
    "Session",
    "SessionActor",
    "TextConnectionActor",
    "expiry_from_exptime",
    "validate_queue_name",
]
