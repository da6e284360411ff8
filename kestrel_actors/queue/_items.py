"""A queue's in-memory items, packed: :class:`PackedItems` (issue 56 point 4).

An :class:`Item` object holding 100 B costs about 220 B of memory (the object, its ``bytes``
with CPython's header rounded up by pymalloc, a deque slot). A queue holding a backlog keeps
most of its items packed instead: once the items appended since the last packing hold
:data:`CHUNK_BYTES`, they are joined into one ``bytes`` chunk of records, each its data's length,
add time and expiry (:data:`RECORD`, 20 B) and its data, so that 100 B items take about 120 B.
Only the head is taken out of its chunk as an ``Item``, when it is read (a GET slices its data
out; an open read keeps the ``Item`` it was given).

The order of the entries, head first: items put back at the head (an unremove, or a head
taken out of its chunk), chunks, then the items appended since the last packing. An item of
:data:`LONE_ITEM_BYTES` or more is never packed (packing would copy it twice for a tenth of its
memory or less): it stays an entry of its own. A short queue (a flood, a consumer keeping up) holds
less than a chunk and never packs: its items come and go as they do in a deque.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Iterator
from typing import Final

from ._journal import Item

__all__ = ["CHUNK_BYTES", "LONE_ITEM_BYTES", "RECORD", "PackedItems"]

RECORD: Final = struct.Struct("<Iqq")
"""A packed item's header: the data's length, its add time and its expiry (epoch ms)."""
_RECORD_SIZE: Final = RECORD.size
# through C statics, not a lookup by name per call (ADR 0015)
_pack: Final = RECORD.pack
_unpack_from: Final = RECORD.unpack_from
_join: Final = b"".join
_append: Final = deque.append
_appendleft: Final = deque.appendleft
_popleft: Final = deque.popleft
_pop: Final = deque.pop

CHUNK_BYTES: Final = 64 * 1024
"""Data appended since the last packing that makes a chunk: about 550 records of 100 B."""
LONE_ITEM_BYTES: Final = 1024
"""Items this long or longer stay ``Item`` entries. Their objects (about 110 B) are a tenth of
them or less, and packing copies the data twice (into the chunk, out for the GET): with 1 KiB
items a one-client GET cost 10% more server CPU packed."""


class PackedItems:
    """A queue's items in memory, head first: a deque's ``append``, ``appendleft``,
    ``popleft`` and ``len``, with :meth:`head` for ``[0]``."""

    __slots__ = ("_entries", "_offset", "_run", "_run_bytes", "count")

    def __init__(self) -> None:
        self._entries: deque[Item | bytes] = deque()
        """``Item`` entries and chunks (``bytes``) of packed records, head first."""
        self._offset = 0
        """Where the head chunk's next record starts (the records before it were taken)."""
        self._run = 0
        """How many entries at the tail are items not packed yet (appended since the last
        packing, none of them lone)."""
        self._run_bytes = 0
        self.count = 0
        """The items held (``len``)."""

    def __len__(self) -> int:
        return self.count

    def __bool__(self) -> bool:
        return self.count != 0

    def __iter__(self) -> Iterator[Item]:
        """Every item, head first, packed ones as new ``Item`` objects."""
        offset = self._offset
        for entry in list(self._entries):
            if isinstance(entry, Item):
                yield entry
                continue
            end = len(entry)
            while offset < end:
                item, offset = _unpack(entry, offset)
                yield item
            offset = 0

    def __repr__(self) -> str:
        return f"PackedItems({self.count} items, {len(self._entries)} entries)"

    def append(self, item: Item) -> None:
        """Add ``item`` (``xid`` 0) at the tail."""
        size = len(item.data)
        self.count += 1
        if size >= LONE_ITEM_BYTES:
            if self._run:
                self._pack_run()
            _append(self._entries, item)
            return
        _append(self._entries, item)
        self._run += 1
        self._run_bytes += size
        if self._run_bytes >= CHUNK_BYTES:
            self._pack_run()

    def appendleft(self, item: Item) -> None:
        """Put ``item`` back at the head."""
        _appendleft(self._entries, item)
        self.count += 1

    def head(self) -> Item | None:
        """The head item (``None`` when empty), taken out of its chunk if packed: the next
        :meth:`popleft` answers the same object."""
        entries = self._entries
        if not entries:
            return None
        entry = entries[0]
        if isinstance(entry, Item):
            return entry
        item = self._take_packed(entry)
        _appendleft(entries, item)
        return item

    def popleft(self) -> Item:
        """Remove the head item and answer it (``IndexError`` when empty)."""
        entries = self._entries
        entry = entries[0]
        self.count -= 1
        if isinstance(entry, Item):
            if len(entries) == self._run:  # the head is one of the items not packed yet
                self._run -= 1
                self._run_bytes -= len(entry.data)
            _popleft(entries)
            return entry
        return self._take_packed(entry)

    def _take_packed(self, chunk: bytes) -> Item:
        """The head chunk's next record, as an ``Item``; the chunk goes once it is used up."""
        item, offset = _unpack(chunk, self._offset)
        if offset >= len(chunk):
            _popleft(self._entries)
            offset = 0
        self._offset = offset
        return item

    def _pack_run(self) -> None:
        """Join the items not packed yet into one chunk, in their place at the tail."""
        entries = self._entries
        index = 2 * self._run
        parts: list[bytes] = [b""] * index
        while index:
            entry = _pop(entries)
            assert isinstance(entry, Item)
            data = entry.data
            index -= 2
            parts[index] = _pack(len(data), entry.add_time, entry.expiry)
            parts[index + 1] = data
        _append(entries, _join(parts))
        self._run = 0
        self._run_bytes = 0


def _unpack(chunk: bytes, offset: int) -> tuple[Item, int]:
    """The record of ``chunk`` at ``offset`` and where the next one starts."""
    size, add_time, expiry = _unpack_from(chunk, offset)
    start = offset + _RECORD_SIZE
    end = start + size
    return Item(chunk[start:end], add_time, expiry), end
