"""What a queue needs from its journal: the :class:`Journal` base class and the :class:`Item` it writes.

The queue calls one method per change, in the order the changes happen (these mirror
Kestrel's journal records, behaviour §6.3). A journal may write lazily, but must keep that order, and
:meth:`Journal.after_durable` is how a queue holds a reply until the write that it covers is as
durable as the queue's ``sync_journal`` policy promises.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mypy_extensions import mypyc_attr

__all__ = ["Item", "Journal"]


class Item:
    """One queued item: its bytes, when it was added, when it expires (epoch ms, 0 = never).

    ``xid`` is set while the item is open (a tentative read); 0 otherwise. ``opened`` is when
    the queue last opened it (epoch ms), for ``open_transaction_timeout``: kept on the item, a
    read opened and confirmed costs no second table beside ``QueueCore.open_reads``.
    """

    __slots__ = ("data", "add_time", "expiry", "xid", "opened")

    def __init__(self, data: bytes, add_time: int, expiry: int = 0, xid: int = 0) -> None:
        self.data = data
        self.add_time = add_time
        self.expiry = expiry
        self.xid = xid
        self.opened = 0

    def __repr__(self) -> str:
        return f"Item({self.data[:32]!r}, add_time={self.add_time}, expiry={self.expiry}, xid={self.xid})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Item)
            and self.data == other.data
            and self.add_time == other.add_time
            and self.expiry == other.expiry
            and self.xid == other.xid
        )


@mypyc_attr(allow_interpreted_subclasses=True)
class Journal:
    """The journal interface of one queue (the calls match Kestrel's records, behaviour §6.3).

    A base class rather than a ``Protocol``: the queue calls its journal several times per
    request, and compiled code calls a ``Protocol``'s methods by name but a base class's through
    its method table (ADR 0015). ``FileJournal`` and ``MemoryJournal`` subclass it; a subclass
    calls ``super().__init__()``, which sets the two attributes below.
    """

    failure: OSError | None
    """Set while the journal cannot write (a full disk, an I/O error); ``None`` otherwise.
    A queue refuses adds meanwhile; changes already made are written once it recovers."""

    maintenance_due: bool
    """A rotation or rewrite is due but was left for the queue's own greenlet, which calls
    :meth:`check_rotate` again (and clears this) before it answers the batch that found it."""

    def __init__(self) -> None:
        self.failure = None
        self.maintenance_due = False

    def add(self, item: Item) -> None:
        """An item was appended at the tail (ADDX)."""
        raise NotImplementedError

    def remove(self) -> None:
        """The head item was removed for good (REMOVE)."""
        raise NotImplementedError

    def remove_many(self, count: int) -> None:
        """:meth:`remove`, ``count`` times: the head items were removed for good, one after
        another, with no other record between them (a pipelined burst's GETs, ADR 0021)."""
        raise NotImplementedError

    def remove_tentative(self, xid: int) -> None:
        """The head item was opened under ``xid`` (REMOVE_TENTATIVE_XID)."""
        raise NotImplementedError

    def remove_tentative_many(self, xids: list[int]) -> None:
        """The head items were opened, in turn, under ``xids``: :meth:`remove_tentative` for
        each, in one go (a ``monitor``'s batch, ADR 0022)."""
        raise NotImplementedError

    def remove_tentative_run(self, first: int, count: int) -> None:
        """:meth:`remove_tentative_many` of the ``count`` xids from ``first`` on (a run a
        ``monitor`` step opened: ``QueueCore.open_many``)."""
        raise NotImplementedError

    def unremove(self, xid: int) -> None:
        """Open item ``xid`` went back to the head (UNREMOVE)."""
        raise NotImplementedError

    def confirm_remove(self, xid: int) -> None:
        """Open item ``xid`` was confirmed (CONFIRM_REMOVE)."""
        raise NotImplementedError

    def confirm_remove_many(self, xids: list[int]) -> None:
        """Open items ``xids`` were confirmed: :meth:`confirm_remove` for each, in one go
        (a ``confirm`` of a ``monitor``'s batch)."""
        raise NotImplementedError

    def confirm_remove_run(self, first: int, count: int) -> None:
        """:meth:`confirm_remove_many` of the ``count`` xids from ``first`` on (a ``confirm``
        of a run a ``monitor`` opened)."""
        raise NotImplementedError

    def after_durable(self, callback: Callable[[], None],
                      on_error: Callable[[OSError], None] | None = None) -> None:
        """Call ``callback`` once every change so far is as durable as the policy promises.

        It may be called at once (no fsync policy, or nothing pending) or later, on the hub.
        With ``on_error``, a failing journal calls ``on_error(exc)`` instead, without waiting
        for it to recover (the changes stay pending and are written once it does).
        """
        raise NotImplementedError

    def durable_now(self) -> bool:
        """Whether every change so far is as durable as the policy promises now, after the
        write this turn may make at once (no fsync policy, a small batch, the file free).

        True means a reply may go without waiting: the caller answers itself, and makes no
        callback for :meth:`after_durable` (three objects per lone request, issue 24). False
        means nothing yet: the caller goes on to :meth:`after_durable`.
        """
        raise NotImplementedError

    def hold(self) -> int:
        """Write nothing appended from now on until :meth:`release` gets the token returned
        (an expiry move's REMOVE waits for the target's ADD to be durable)."""
        raise NotImplementedError

    def release(self, token: int) -> None:
        """End one :meth:`hold`."""
        raise NotImplementedError

    def size(self) -> int:
        """Bytes in the current journal file (the ``logsize`` stat)."""
        raise NotImplementedError

    def close(self) -> None:
        """Flush and close; the journal is not used again."""
        raise NotImplementedError

    def erase(self) -> None:
        """Close and delete every file of this journal (the queue was deleted)."""
        raise NotImplementedError

    def observe(self, metrics: Any, sync_stats: Any) -> None:
        """Record file work from now on: rotation and rewrite times in ``metrics`` (the
        queue's: ``histogram(name).add(value)``), fdatasyncs in ``sync_stats`` (the server's,
        a ``journal.SyncStats``)."""
        raise NotImplementedError

    # -- rotation and read-behind (behaviour §6.6, §5.8); no-ops for a journal without files ----------
    # ``queue`` below is the queue's state: ``items`` (in memory, head first), ``open_reads``
    # (xid → Item), ``bytes`` (all bytes) and optionally ``length`` (all items, with those
    # only on disk; ``len(items)`` if absent). A QueueCore fits.

    @property
    def in_read_behind(self) -> bool:
        """True while some of the queue's items are only on disk."""
        raise NotImplementedError

    def check_rotate(self, queue: Any) -> None:
        """Kestrel's checkRotateJournal: in an add before ``add()``, in a remove after it.

        Called on the hub (a queue run from a socket callback), where file work may not wait,
        a journal that finds a rotation or rewrite due sets :attr:`maintenance_due` instead."""
        raise NotImplementedError

    def rotation_due(self, queue: Any) -> bool:
        """Whether :meth:`check_rotate` has file work to do for ``queue`` now."""
        raise NotImplementedError

    def rewrite(self, queue: Any) -> bool:
        """Compact every file into one holding ``queue``'s open reads and items."""
        raise NotImplementedError

    def start_read_behind(self) -> None:
        """From now on the queue keeps new items on disk only."""
        raise NotImplementedError

    def read_behind(self) -> Item | None:
        """The next on-disk item to bring into memory; ``None`` ends read-behind."""
        raise NotImplementedError
