"""The queue's own logic, with no actors and no I/O: what a queue is and the rules it keeps.

:class:`QueueCore` (Kestrel's ``PersistentQueue``), the :class:`WaitList` of parked fetches,
:class:`Item`, the :class:`PackedItems` a queue holds its items in, and the :class:`Journal`
base class a queue writes through (``journal/`` implements it). Both ``journal/`` and
``actors/`` import this room; it imports neither.
"""

from ._core import QueueCore, QueueLimits, take_head
from ._items import PackedItems
from ._journal import Item, Journal
from ._rules import (
    MAX_NAME_BYTES,
    XID_MAX,
    epoch_ms,
    fanout_master,
    is_fanout_child,
    is_queue_name,
    name_problem,
    next_xid,
)
from ._waitlist import Waiter, WaitList

__all__ = [
    "MAX_NAME_BYTES",
    "XID_MAX",
    "Item",
    "Journal",
    "PackedItems",
    "QueueCore",
    "QueueLimits",
    "WaitList",
    "Waiter",
    "epoch_ms",
    "fanout_master",
    "is_fanout_child",
    "is_queue_name",
    "name_problem",
    "next_xid",
    "take_head",
]
