"""The dispatcher: tells that hub callbacks hand over, made from a greenlet (ADR 0002)."""

from __future__ import annotations

import weakref
from typing import Any, ClassVar, Final

import gevent
from greenlet import getcurrent

from .._clock import TURN
from ._actor import of_this_hub, runs_off_hub, tell_quietly

__all__ = ["Dispatcher"]

_getcurrent: Final = getcurrent
"""``getcurrent`` as a ``Final``: compiled code calls it through a C static rather than a lookup in
the module's dict (a tell asks it; ADR 0015)."""


class Dispatcher:
    """Makes tells on behalf of the hub, in the order they were handed over.

    A hub callback (a socket became readable) may run a handler only if the receiver says none
    can suspend now (``may_run_on_hub``): the hub has nowhere to switch to. When the callback
    is the loop's only ready event, :meth:`tell_from_hub` tells at once, and such a receiver
    runs right there, without a greenlet switch. Otherwise the callback hands the tell to
    :meth:`deliver`, and all due tells are made together, once per burst (so that a burst's
    requests share a journal write): a small burst (:data:`HUB_BURST_MAX`) on the hub, in one
    loop callback (:meth:`_run_on_hub`), while each receiver may run there, as
    :meth:`tell_from_hub`'s would. A larger burst goes to a dispatcher greenlet, on which an
    idle receiver runs inline, and so does the rest of a small one from its first tell that
    would run inline where the hub may not (:func:`runs_off_hub`: a queue with journal file
    work due). A small burst on the hub costs no greenlet switch (two on the greenlet: ADR 0020).
    If a handler suspends a dispatcher greenlet (journal file work on the threadpool), the next
    :meth:`deliver` from elsewhere starts another burst for what is due, so one slow queue does
    not hold up the rest. Tells still reach each actor in order: they are taken from one FIFO,
    and a busy actor queues them in its own inbox.

    The due tells are one list, each a receiver then its message, read from :attr:`head` on
    (shared by every dispatcher greenlet, so one that resumes after a suspended handler goes on
    from where the others got) and emptied when all are told: a tell costs two list appends
    and two reads, where a deque's ``append`` and ``popleft`` of a pair were two method calls
    and a tuple (about 250 instructions a durable SET, callgrind).
    """

    _by_hub: ClassVar[weakref.WeakKeyDictionary[Any, Dispatcher]] = weakref.WeakKeyDictionary()
    MAX_PARKED: Final = 8
    HUB_BURST_MAX: Final = 4
    TOLD_KEPT_MAX: Final = 2048
    """Entries of :attr:`tells` already told that may stay before the list's front is cut: a
    stream of tells that never lets the list empty would otherwise hold every told message."""
    """The most tells a burst may hold to be told on the hub. Each costs more there than inline on
    a dispatcher greenlet (the hub's nesting rules, a queue's ``may_run_on_hub``: about 600
    instructions with its batch), which saves the burst two greenlet switches (about 2,000):
    a flood's burst (a SET and a GET) gains, a burst of 100 clients' requests would lose."""

    def __init__(self, hub: Any) -> None:
        self.hub = hub
        self.loop = hub.loop
        """The hub's loop, read for every tell from the hub (one lookup by name less)."""
        self.tells: list[Any] = []
        """The tells handed over, each a receiver then its message; those before :attr:`head`
        are made (or being made)."""
        self.head = 0
        self.parked: list[Any] = []
        self.running: set[Any] = set()
        self.woken = False
        self.on_hub = False
        """A burst is being told on the hub (:meth:`_run_on_hub`): a tell due meanwhile joins it."""

    @property
    def due(self) -> int:
        """How many tells are due (handed over and not yet made)."""
        return (len(self.tells) - self.head) >> 1

    @classmethod
    def current(cls) -> Dispatcher:
        """The dispatcher of this thread's hub."""
        return of_this_hub(cls._by_hub, cls)

    def tell_from_hub(self, ref: Any, message: Any) -> None:
        """From a hub callback: ``ref.tell(message)`` now if no other event of this loop
        iteration waits (no watcher left to run, no tell due), else :meth:`deliver` it.

        Telling now lets an idle receiver that may run on the hub handle a lone request with no
        greenlet switch; with other events pending, the dispatcher makes the burst's tells
        together, so that the end-of-burst hook still sees them all.
        """
        if len(self.tells) != self.head or self.loop.pendingcnt:
            self.deliver(ref, message)
            return
        TURN.begin()  # what the tell runs takes the time from this one reading (``_clock``)
        try:
            tell_quietly(ref, message, self.hub)
        finally:
            TURN.end()

    def deliver(self, ref: Any, message: Any) -> None:
        """``ref.tell(message)`` soon, with the burst's other tells, after what is already due.

        A dead receiver is skipped silently, as a tell to it would fail.
        """
        tells = self.tells
        tells.append(ref)
        tells.append(message)
        if self.woken or self.on_hub or _getcurrent() in self.running:
            return  # a dispatcher is about to run, or is running right here
        self.woken = True
        self.loop.run_callback(self._run_on_hub)

    def _run_on_hub(self) -> None:
        """Make the due tells on the hub (a loop callback) while their receivers may run there;
        hand the rest, from the first that may not, to a dispatcher greenlet."""
        self.woken = False
        tells = self.tells
        if len(tells) - self.head > 2 * self.HUB_BURST_MAX:
            self._wake_greenlet()
            return
        self.on_hub = True
        TURN.begin()  # one reading of the clock for the burst's tells, as for a lone one
        try:
            while True:
                head = self.head
                if head == len(tells):
                    self._told_all()
                    break
                ref = tells[head]
                message = tells[head + 1]
                if runs_off_hub(ref, message):
                    break
                self._step_past(head)
                tell_quietly(ref, message, self.hub)
        finally:
            TURN.end()
            self.on_hub = False
        if self.head != len(tells) and not self.woken:
            self._wake_greenlet()

    def _step_past(self, head: int) -> None:
        """The tell at ``head`` is taken; past :attr:`TOLD_KEPT_MAX` the told ones are cut off."""
        if head < self.TOLD_KEPT_MAX:
            self.head = head + 2
        else:
            del self.tells[:head + 2]
            self.head = 0

    def _told_all(self) -> None:
        """Every due tell has been made: the list starts again, empty."""
        self.tells.clear()
        self.head = 0

    def _wake_greenlet(self) -> None:
        self.woken = True
        if self.parked:
            self.loop.run_callback(self.parked.pop().switch)
        else:
            gevent.spawn(self._run)

    def after_burst(self, ref: Any, message: Any) -> bool:
        """The end-of-burst hook: ``ref.tell(message)`` once the tells due now have been made.

        Returns ``False``, doing nothing, when no tell is due: the burst is over, and the
        caller does at once what it would have done then. A queue holds its answers this way
        so that every batch of one burst shares one journal write.
        """
        if self.head == len(self.tells):
            return False
        self.deliver(ref, message)
        return True

    def _run(self) -> None:
        me = _getcurrent()
        tells = self.tells
        running = self.running
        running.add(me)
        try:
            while True:
                self.woken = False
                # self.head read anew for each tell: another dispatcher greenlet may have made
                # tells while a handler suspended this one
                while True:
                    head = self.head
                    if head == len(tells):
                        self._told_all()
                        break
                    ref = tells[head]
                    message = tells[head + 1]
                    self._step_past(head)
                    tell_quietly(ref, message, me)
                if len(self.parked) >= self.MAX_PARKED:
                    return
                running.discard(me)
                self.parked.append(me)
                self.hub.switch()  # until deliver() wakes this one
                running.add(me)
        finally:
            running.discard(me)
