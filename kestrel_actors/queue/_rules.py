"""The rules every part of the server applies to queues, each in one place.

Transaction ids (behaviour §6.3: positive 32-bit, wrapping past an id still open) and the clock items
are stamped with; the name rules, the fanout ``+`` split among them (behaviour §5.9), are
``kestrel_actors.queue_name`` (a name is bytes on the wire and on disk too), handed on here. The config file, the
collection, the journal replay and the offline tools all use these.
"""

from __future__ import annotations

import time
from collections.abc import Container
from typing import Final

from .._clock import TURN
from ..queue_name import MAX_NAME_BYTES, fanout_master, is_fanout_child, is_queue_name, name_problem

__all__ = [
    "MAX_NAME_BYTES", "XID_MAX", "epoch_ms", "fanout_master", "is_fanout_child", "is_queue_name", "name_problem",
    "next_xid",
]

XID_MAX: Final = 2**31 - 1  # Final: a C static in the compiled build, read per open read


def next_xid(last: int, taken: Container[int]) -> int:
    """The transaction id after ``last`` that is not in ``taken`` (wrapping at ``XID_MAX``): the
    xids open (a replay's dict, a queue's ``OpenReads``, looked up only once the xids have wrapped)."""
    xid = last
    while True:
        xid = xid + 1 if xid < XID_MAX else 1
        if xid not in taken:
            return xid


_time: Final = time.time  # a C static in the compiled build, not a lookup by name per call


def epoch_ms() -> int:
    """The wall clock in epoch milliseconds, the unit of item times and expiries: inside the tells
    of a read its reading (``_clock.TURN``: when the request's read was handled), else the clock's."""
    now = TURN.now
    return int((now if now else _time()) * 1000)
