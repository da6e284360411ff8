"""The server's actors: one per queue, and the collection that knows them by name."""

from ._collection import QueueCollection
from ..messages import BatchDone, QueueBatch, Session
from ._queue import QueueActor
from ..stats import ServerStats

__all__ = [
    "BatchDone",
    "QueueActor",
    "QueueBatch",
    "QueueCollection",
    "ServerStats",
    "Session",
]
