"""The server's actors: one per queue, and the collection that knows them by name."""

from ..messages import BatchDone, QueueBatch, Session
from ..stats import ServerStats
from ._collection import QueueCollection, QueueOpener, memory_opener
from ._queue import QueueActor

__all__ = [
    "BatchDone",
    "QueueActor",
    "QueueBatch",
    "QueueCollection",
    "QueueOpener",
    "ServerStats",
    "Session",
    "memory_opener",
]
