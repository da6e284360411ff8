"""Server-wide counters (the global part of STATS, reference §7.3).

Actors of one server all run on the same gevent hub thread, and a greenlet switches only at
an I/O or inbox wait, so ``stats.cmd_get += 1`` from any actor is atomic. Sharing these plain
integers avoids a message per request just to count it.
"""

from __future__ import annotations

import time

__all__ = ["ServerStats"]


class ServerStats:
    __slots__ = (
        "start_time",
        "total_items",
        "curr_connections",
        "total_connections",
        "cmd_get",
        "cmd_set",
        "cmd_peek",
        "get_hits",
        "get_misses",
        "bytes_read",
        "bytes_written",
        "queue_creates",
        "queue_deletes",
        "queue_expires",
    )

    def __init__(self) -> None:
        self.start_time = time.time()
        for name in self.__slots__[1:]:
            setattr(self, name, 0)
