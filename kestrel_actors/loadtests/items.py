"""Item payloads shared by every scenario: the lyric filler, id-stamped items, packing items.

Kestrel's load tests spam a 752-character pop-song lyric. We keep the same sizes (751
characters plus a final newline, repeated or cut to the item size) but use an original text,
so byte counts and request sizes match Kestrel's runs without copying the song.

Scenarios that must detect lost, duplicated or reordered items stamp each item with its id
as 8 lower-case hex digits in front of the filler (``make_item``); the consumer recovers the
id with ``item_id`` and checks the rest of the bytes with ``check_item`` at memcmp speed.
"""

from __future__ import annotations

__all__ = ["ID_WIDTH", "LYRIC", "check_item", "filler", "item_id", "make_item", "packing_item"]

LYRIC = (
    "the queue was long and the night was longer\n"
    "we wrote our names in the journal line by line\n"
    "each one a promise that somebody would read\n"
    "a byte for the morning, a byte for the rain\n"
    "we set them down and waited for replies\n"
    "stored, said the server, and we believed it\n"
    "\n"
    "no order but the order we arrived in\n"
    "first in, first out, the oldest rule we know\n"
    "open the door and hold it for a moment\n"
    "close it softly once the work is done\n"
    "if the line goes dead before you answer\n"
    "the item goes back to the head of the line\n"
    "\n"
    "confirm me, confirm me, said the message\n"
    "i have waited in the spool so long\n"
    "i rolled with the journal, packed with the rest\n"
    "i survived the restart and the power cut\n"
    "so count me once and never count me twice\n"
    "we are the items, here until the end.\n"
).encode("ascii")

ID_WIDTH = 8

_FILLERS: dict[int, bytes] = {}


def filler(size: int) -> bytes:
    """The lyric repeated or cut to exactly ``size`` bytes (Kestrel's ``put-many -b``)."""
    data = _FILLERS.get(size)
    if data is None:
        data = (LYRIC * (size // len(LYRIC) + 1))[:size]
        _FILLERS[size] = data
    return data


def make_item(item: int, size: int) -> bytes:
    """Item number ``item`` as ``%08x`` followed by filler, ``size`` bytes in all (>= 8)."""
    if size < ID_WIDTH:
        raise ValueError(f"id-stamped items need at least {ID_WIDTH} bytes, not {size}")
    return b"%08x" % item + filler(size)[ID_WIDTH:]


def item_id(data: bytes) -> int:
    """The id stamped on an item by ``make_item``; ValueError if it has none."""
    return int(data[:ID_WIDTH], 16)


def check_item(data: bytes, size: int) -> int:
    """Return the id of a well-formed ``make_item`` payload, or raise ValueError."""
    if len(data) != size or data[ID_WIDTH:] != filler(size)[ID_WIDTH:]:
        raise ValueError(f"item bytes differ from the expected filler: {data[:40]!r}...")
    return item_id(data)


def packing_item(counter: int, size: int) -> bytes:
    """Kestrel's JournalPacking item: the decimal counter followed by x's, cut to ``size``."""
    return (b"%d" % counter + b"x" * size)[:size]
