"""The wall clock as the request path reads it: once for a client's read, not once per use.

The dispatcher (``runtime._dispatcher``) reads the clock when it tells, on the hub, what a
socket's read callback hands it (``tell_from_hub``) or a small burst of one loop iteration's reads
(``_run_on_hub``) (:meth:`TurnClock.begin`), and forgets the reading when the tells return
(:meth:`TurnClock.end`). What runs inside (the session's batch, the queue running it inline, the
answer, its latency figures) takes the time from :data:`TURN` instead of reading the clock each:
a lone SET read it three times, a GET four, at about 170 instructions and a float each (ADR 0020).
So an item's add time, and the ``now`` its queue checks expiries against, is when the server
handled the read that brought the request, as the items of one batch already shared one reading.
Outside those (a dispatcher greenlet's burst, which may wait, a timer, a woken waiter's turn)
:data:`TURN` holds nothing and each use reads the clock. Handlers on the hub never wait, so a
reading is as old as its tells' own work. Servers on other threads of one process (tests) share
:data:`TURN`: what one takes may then be another's reading of about the same moment.
"""

from __future__ import annotations

import time
from typing import Final

__all__ = ["TURN", "TurnClock", "epoch_seconds"]

_time: Final = time.time  # a C static in the compiled build, not a lookup by name per call


class TurnClock:
    """The reading of the wall clock that the tells running on the hub share (see the module docstring)."""

    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = 0.0
        """Epoch seconds, as read when the running tells began; 0.0: none runs."""

    def begin(self) -> None:
        self.now = _time()

    def end(self) -> None:
        self.now = 0.0


TURN: Final = TurnClock()


def epoch_seconds() -> float:
    """The wall clock in epoch seconds: the running tells' reading, else the clock's."""
    now = TURN.now
    return now if now else _time()
