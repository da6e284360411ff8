"""The server's actors: one per queue, and the collection that knows them by name."""

from ._collection import QueueCollection
from ._session_queue import BatchDone, QueueBatch, Session
from ._queue import QueueActor
from ._stats import ServerStats

__all__ = [
    "BatchDone",
    "QueueActor",
    "QueueBatch",
    "QueueCollection",
    "ServerStats",
    "Session",
]
