"""A queue's in-memory items, packed: :class:`PackedItems` (issue 56 point 4).

An :class:`Item` object holding 100 B costs about 220 B of memory (the object, its ``bytes``
with CPython's header rounded up by pymalloc, a list slot). A queue holding a backlog keeps
most of its items packed instead: once the items appended since the last packing hold
:data:`CHUNK_BYTES`, they are joined into one ``bytes`` chunk of records, each its data's length,
add time and expiry (:data:`RECORD`, 20 B) and its data, so that 100 B items take about 120 B.
Only the head is taken out of its chunk as an ``Item``, when it is read (a GET slices its data
out; an open read keeps the ``Item`` it was given).

The order of the entries, head first: items put back at the head (an unremove, or a head
taken out of its chunk), chunks, then the items appended since the last packing. An item of
:data:`LONE_ITEM_BYTES` or more is never packed (packing would copy it twice for a tenth of its
memory or less): it stays an entry of its own. A short queue (a flood, a consumer keeping up) holds
less than a chunk and never packs: its items come and go as they would in a deque.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Final

from ._journal import Item

__all__ = ["CHUNK_BYTES", "COMPACT_AT", "LONE_ITEM_BYTES", "RECORD", "PackedItems"]

RECORD: Final = struct.Struct("<Iqq")
"""A packed item's header: the data's length, its add time and its expiry (epoch ms)."""
_RECORD_SIZE: Final = RECORD.size
# through C statics, not a lookup by name per call (ADR 0015)
_pack: Final = RECORD.pack
_unpack_from: Final = RECORD.unpack_from
_join: Final = b"".join

CHUNK_BYTES: Final = 64 * 1024
"""Data appended since the last packing that makes a chunk: about 550 records of 100 B."""
COMPACT_AT: Final = 128
"""Taken slots at the head of :class:`PackedItems`' list that are let go together (about 1 KiB)."""
LONE_ITEM_BYTES: Final = 1024
"""Items this long or longer stay ``Item`` entries. Their objects (about 110 B) are a tenth of
them or less, and packing copies the data twice (into the chunk, out for the GET): with 1 KiB
items a one-client GET cost 10% more server CPU packed."""


class PackedItems:
    """A queue's items in memory, head first: a deque's ``append``, ``appendleft``,
    ``popleft`` and ``len``, with :meth:`head` for ``[0]``.

    The entries are a list read from a moving head (:attr:`_first`), not a deque: in the
    compiled build a list's slot is read and cleared in place, where a deque's ``popleft`` is a
    call (a pipelined drain's GET cost less so). The slots taken at the head are let go
    :data:`COMPACT_AT` at a time at least, once they are half the list or more."""

    __slots__ = ("_entries", "_first", "_offset", "_run", "_run_bytes", "count", "expiring")

    def __init__(self) -> None:
        self._entries: list[Item | bytes | None] = []
        """``Item`` entries and chunks (``bytes``) of packed records from :attr:`_first` on,
        head first; the slots before it are taken (``None``)."""
        self._first = 0
        """Where the head entry is (``len(_entries)`` when there is none)."""
        self._offset = 0
        """Where the head chunk's next record starts (the records before it were taken)."""
        self._run = 0
        """How many entries at the tail are items not packed yet (appended since the last
        packing, none of them lone)."""
        self._run_bytes = 0
        self.count = 0
        """The items held (``len``)."""
        self.expiring = 0
        """The items held that have an expiry (not 0): while none has, no head in memory expires
        and a queue needs no look at it (``QueueCore.discard_expired``, for every add)."""

    def __len__(self) -> int:
        return self.count

    def __bool__(self) -> bool:
        return self.count != 0

    def __iter__(self) -> Iterator[Item]:
        """Every item, head first, packed ones as new ``Item`` objects."""
        offset = self._offset
        for entry in self._entries[self._first:]:
            if isinstance(entry, Item):
                yield entry
                continue
            assert entry is not None
            end = len(entry)
            while offset < end:
                item, offset = _unpack(entry, offset)
                yield item
            offset = 0

    def __repr__(self) -> str:
        return f"PackedItems({self.count} items, {len(self._entries) - self._first} entries)"

    def append(self, item: Item) -> None:
        """Add ``item`` (``xid`` 0) at the tail."""
        size = len(item.data)
        self.count += 1
        if item.expiry:
            self.expiring += 1
        if size >= LONE_ITEM_BYTES:
            if self._run:
                self._pack_run()
            self._entries.append(item)
            return
        self._entries.append(item)
        self._run += 1
        self._run_bytes += size
        if self._run_bytes >= CHUNK_BYTES:
            self._pack_run()

    def appendleft(self, item: Item) -> None:
        """Put ``item`` back at the head."""
        self._put_first(item)
        self.count += 1
        if item.expiry:
            self.expiring += 1

    def head(self) -> Item | None:
        """The head item (``None`` when empty), taken out of its chunk if packed: the next
        :meth:`popleft` answers the same object."""
        entries = self._entries
        first = self._first
        if first == len(entries):
            return None
        entry = entries[first]
        if isinstance(entry, Item):
            return entry
        assert entry is not None
        item = self._take_packed(entry)
        self._put_first(item)
        return item

    def popleft(self) -> Item:
        """Remove the head item and answer it (``IndexError`` when empty)."""
        entries = self._entries
        first = self._first
        entry = entries[first]
        self.count -= 1
        if isinstance(entry, Item):
            if len(entries) - first == self._run:  # the head is one of the items not packed yet
                self._run -= 1
                self._run_bytes -= len(entry.data)
            self._drop_first(entries, first)
            item = entry
        else:
            assert entry is not None
            item = self._take_packed(entry)
        if item.expiry:
            self.expiring -= 1
        return item

    def pop_run(self, count: int, budget: int, taken: list[Item]) -> int:
        """:meth:`popleft` up to ``count`` times while the items taken hold less than
        ``budget`` bytes, each appended to ``taken``, stopping before an item that may expire
        (``expiry`` not 0: :attr:`expiring` counts none of those taken) -> the bytes taken.

        A pipelined burst's run of heads in one call: the head index, the unpacked run's
        count and the taken slots' letting go are settled once for the run, not per item."""
        entries = self._entries
        first = self._first
        end = len(entries)
        run_from = end - self._run  # the entries from here on are items not packed yet
        size = 0
        run_size = 0  # of the items not packed yet taken
        taken_count = 0
        while taken_count < count and size < budget and first < end:
            entry = entries[first]
            if isinstance(entry, Item):
                if entry.expiry != 0:
                    break
                if first >= run_from:
                    run_size += len(entry.data)
                entries[first] = None
                first += 1
                item = entry
            else:
                assert entry is not None
                offset = self._offset
                if _unpack_from(entry, offset)[2] != 0:
                    break
                item, offset = _unpack(entry, offset)
                if offset >= len(entry):
                    entries[first] = None
                    first += 1
                    offset = 0
                self._offset = offset
            taken.append(item)
            size += len(item.data)
            taken_count += 1
        if first > run_from:  # some of the items not packed yet were taken
            self._run -= first - run_from
            self._run_bytes -= run_size
        self.count -= taken_count
        if first >= COMPACT_AT and first + first >= len(entries):
            del entries[:first]
            first = 0
        self._first = first
        return size

    def _drop_first(self, entries: list[Item | bytes | None], first: int) -> None:
        """Let the head entry go: its slot is taken; the taken slots go once they are at least
        :data:`COMPACT_AT` and half the list (a drain moves each entry left at most once)."""
        entries[first] = None
        first += 1
        if first >= COMPACT_AT and first + first >= len(entries):
            del entries[:first]
            first = 0
        self._first = first

    def _put_first(self, item: Item) -> None:
        """Put ``item`` in the slot before the head, making room at the front if there is none
        (half the entries' room more, so that a run of items put back costs no copy each)."""
        first = self._first
        entries = self._entries
        if not first:
            first = len(entries) // 2 + 8
            entries[:0] = [None] * first
        first -= 1
        entries[first] = item
        self._first = first

    def _take_packed(self, chunk: bytes) -> Item:
        """The head chunk's next record, as an ``Item``; the chunk goes once it is used up."""
        item, offset = _unpack(chunk, self._offset)
        if offset >= len(chunk):
            self._drop_first(self._entries, self._first)
            offset = 0
        self._offset = offset
        return item

    def _pack_run(self) -> None:
        """Join the items not packed yet into one chunk, in their place at the tail."""
        entries = self._entries
        index = 2 * self._run
        parts: list[bytes] = [b""] * index
        while index:
            entry = entries.pop()
            assert isinstance(entry, Item)
            data = entry.data
            index -= 2
            parts[index] = _pack(len(data), entry.add_time, entry.expiry)
            parts[index + 1] = data
        entries.append(_join(parts))
        self._run = 0
        self._run_bytes = 0


def _unpack(chunk: bytes, offset: int) -> tuple[Item, int]:
    """The record of ``chunk`` at ``offset`` and where the next one starts."""
    size, add_time, expiry = _unpack_from(chunk, offset)
    start = offset + _RECORD_SIZE
    end = start + size
    return Item(chunk[start:end], add_time, expiry), end
