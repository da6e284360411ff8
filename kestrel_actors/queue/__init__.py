"""The queue's own logic, with no actors and no I/O: what a queue is and the rules it keeps.

:class:`QueueCore` (Kestrel's ``PersistentQueue``), the :class:`WaitList` of parked fetches,
:class:`Item`, and the :class:`Journal` protocol a queue writes through (``journal/``
implements it). Both ``journal/`` and ``actors/`` import this room; it imports neither.
"""

from ._core import QueueCore, epoch_ms, expiry_from_exptime
from ._journal import Item, Journal, MemoryJournal
from ._waitlist import Waiter, WaitList

__all__ = ["Item", "Journal", "MemoryJournal", "QueueCore", "WaitList", "Waiter", "epoch_ms", "expiry_from_exptime"]
