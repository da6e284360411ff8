"""Requests as bytes and replies as values, sans I/O (pymemcache's manner: pure functions).

Builders make a request's bytes; parsers take one reply line and return what it means or
raise through :func:`reply_error`, the one mapping from lines to exceptions. What the server's
own codec already knows is reused from :mod:`kestrel_actors.protocol`: the reply constants,
``value_reply`` (the exact bytes of a hit) and the queue-name rule.
"""

from __future__ import annotations

import math
import re
import sys
from array import array
from dataclasses import dataclass

from ..protocol import DELETED, END, NOT_STORED, STORED, value_reply
from ..queue_name import is_queue_name, name_from_wire
from ._errors import UnexpectedReply, reply_error
from ._scan import COMPILED as _SCAN_COMPILED
from ._scan import MORE as _SCAN_MORE
from ._scan import HeaderScan

__all__ = [
    "DELETED",
    "END",
    "NOT_STORED",
    "STORED",
    "PackedValues",
    "ValueScan",
    "confirm_request",
    "get_options",
    "get_reply_size",
    "get_request",
    "monitor_request",
    "parse_stat",
    "parse_stored",
    "parse_value_header",
    "parse_version",
    "queue_key",
    "set_request",
    "value_reply",
    "wait_ms",
]

_END = END[:-2]
_STORED = STORED[:-2]
_NOT_STORED = NOT_STORED[:-2]
_DELETED = DELETED[:-2]


def queue_key(queue: str) -> bytes:
    """``queue`` as it goes on the wire; ValueError for a name the server would refuse (and
    drop the connection for), so that never happens."""
    if not is_queue_name(queue) or " " in queue:
        raise ValueError(f"not a valid queue name: {queue!r}")
    return queue.encode("utf-8")


def set_request(queue: str, data: bytes, exptime: int = 0) -> bytes:
    """``set <q> 0 <exptime> <len>\\r\\n<data>\\r\\n``."""
    return b"set %s 0 %d %d\r\n%s\r\n" % (queue.encode(), exptime, len(data), data)


def get_request(queue: str, options: str = "") -> bytes:
    """``get <q><options>\\r\\n``; ``options`` is e.g. ``/t=1000/close/open``."""
    return b"get %s%s\r\n" % (queue.encode(), options.encode())


def monitor_request(queue: str, seconds: int, max_items: int, stamp: bool = False) -> bytes:
    """``monitor <q> <seconds> <max_items>[ stamp]\\r\\n``; ``stamp`` asks our server for each
    item's enqueue time (behaviour §2.7; Kestrel ignores the token)."""
    return b"monitor %s %d %d%s\r\n" % (queue.encode(), seconds, max_items, b" stamp" if stamp else b"")


def confirm_request(queue: str, count: int) -> bytes:
    """``confirm <q> <count>\\r\\n`` (reply ``END``)."""
    return b"confirm %s %d\r\n" % (queue.encode(), count)


def wait_ms(seconds: float | None) -> int:
    """A wait in seconds as ``/t=`` milliseconds (0: do not wait). Rounded up, so a wait
    never ends before the caller asked; at most Java's largest int."""
    if seconds is None or seconds <= 0:
        return 0
    return min(math.ceil(seconds * 1000), 2**31 - 1)


def get_options(wait: int = 0, open: bool = False, close: bool = False,  # noqa: A002
                abort: bool = False, peek: bool = False) -> str:
    """The ``/…`` options of a GET key (behaviour §2.5); ``wait`` in milliseconds."""
    options = f"/t={wait}" if wait > 0 else ""
    if close:
        options += "/close"
    if open:
        options += "/open"
    if abort:
        options += "/abort"
    if peek:
        options += "/peek"
    return options


def parse_value_header(command: str, line: bytes, key: bytes | None) -> int | None:
    """The data length of a ``VALUE <key> <flags> <len>`` line, or None for ``END``.

    Kestrel answers with the bare queue name whatever options the key carried (behaviour §2.5); a
    ``key`` of None accepts any."""
    if line == _END:
        return None
    parts = line.split(b" ")
    if parts[0] != b"VALUE":
        raise reply_error(command, line)
    if len(parts) != 4 or (key is not None and parts[1] != key) or not parts[3].isdigit():
        raise UnexpectedReply(f"{command}: bad VALUE line {line[:200]!r} (key {key!r})")
    return int(parts[3])


def get_reply_size(buf: bytes | bytearray, at: int, hit_len: int) -> int:
    """For the load tests, which know a hit's length: how many bytes at ``at`` in ``buf`` are one
    whole GET reply, ``len(END)`` for ``END`` and ``hit_len`` for a ``VALUE`` block; 0 while the
    reply has not all come. :class:`UnexpectedReply` for anything else, a ``VALUE`` whose header
    gives another length included (it is not an item the run put, and waiting for a hit's worth
    of bytes would wait for ever)."""
    head = bytes(buf[at:at + 5])
    if head == END:
        return len(END)
    if head != b"VALUE":
        if len(head) < 5 and (END.startswith(head) or b"VALUE".startswith(head)):
            return 0
        raise UnexpectedReply(f"expected VALUE or END, got {bytes(buf[at:at + 60])!r}")
    line_end = buf.find(b"\r\n", at)
    if line_end < 0:
        if len(buf) - at < hit_len:
            return 0
    else:
        parts = bytes(buf[at:line_end]).split(b" ")
        if len(parts) == 4 and parts[3].isdigit() and line_end + 2 - at + int(parts[3]) + 2 + len(END) == hit_len:
            return hit_len if len(buf) - at >= hit_len else 0
    raise UnexpectedReply(f"not an item this run put: {bytes(buf[at:at + 60])!r}...")


_ZERO_STAMP = bytes(8)


def _holds_zero(stamps: bytes | memoryview) -> bool:
    """Whether one of the int64 ``stamps`` is 0: eight zero bytes at a multiple of 8, found by
    a C-level search (an epoch millisecond's low bytes are never all zero)."""
    data = stamps if isinstance(stamps, bytes) else bytes(stamps)
    at = data.find(_ZERO_STAMP)
    while at >= 0:
        if at % 8 == 0:
            return True
        at = data.find(_ZERO_STAMP, at + 1)
    return False


@dataclass(frozen=True)
class PackedValues:
    """Values back to back: their lengths (uint32, little-endian) and their bytes. Two
    buffers instead of one ``bytes`` object per value: a batch of monitored items is written
    to a file, checksummed and handed to Arrow without a per-item step."""

    lengths: bytes | memoryview
    data: bytes | bytearray | memoryview
    stamps: bytes | memoryview | None = None
    """Each value's enqueue time (epoch ms, int64 little-endian; 0 where the server gave
    none), when they were asked for (``monitor ... stamp``)."""

    @property
    def count(self) -> int:
        return len(self.lengths) // 4

    def stamps_or(self, default_ms: int) -> PackedValues:
        """These values with an enqueue time for each: ``default_ms`` where none is known."""
        if (self.stamps is not None and len(self.stamps) == 8 * self.count
                and not _holds_zero(self.stamps)):
            return self  # (the planner asks this of each part twice: no number boxed)
        stamps = array("q")
        if self.stamps is not None:
            stamps.frombytes(self.stamps)
            if sys.byteorder != "little":
                stamps.byteswap()
        if len(stamps) == self.count and 0 not in stamps:
            return self
        if len(stamps) != self.count:
            stamps = array("q", bytes(8 * self.count))
        stamps = array("q", (stamp or default_ms for stamp in stamps))
        if sys.byteorder != "little":
            stamps.byteswap()
        return PackedValues(self.lengths, self.data, stamps.tobytes())

    def sizes(self) -> array[int]:
        """Each value's length."""
        sizes = array("I")
        sizes.frombytes(self.lengths)
        if sys.byteorder != "little":
            sizes.byteswap()
        return sizes

    def values(self) -> list[bytes]:
        """One ``bytes`` per value."""
        data, at, values = self.data, 0, []
        for size in self.sizes():
            values.append(bytes(data[at:at + size]))
            at += size
        return values

    def take(self, first: int, count: int) -> PackedValues:
        """Values ``first`` to ``first + count - 1``, as views of these buffers."""
        sizes = self.sizes()
        at = sum(sizes[:first])
        size = sum(sizes[first:first + count])
        stamps = None if self.stamps is None else memoryview(self.stamps)[8 * first:8 * (first + count)]
        return PackedValues(memoryview(self.lengths)[4 * first:4 * (first + count)],
                            memoryview(self.data)[at:at + size], stamps)

    @classmethod
    def of(cls, values: list[bytes]) -> PackedValues:
        lengths = array("I", map(len, values))
        if sys.byteorder != "little":
            lengths.byteswap()
        return cls(lengths.tobytes(), b"".join(values))


_VALUE_END = b"\r\nEND\r\n"
_TAIL = len(_VALUE_END)
_LINE_STEP = 256
"""Bytes taken at a time to make a cut header line whole (a value's length is known after it)."""


class ValueScan:
    """A ``monitor`` reply — ``VALUE`` blocks, each with its ``END``, then a final ``END`` —
    taken in bulk as its bytes arrive (sans I/O: :meth:`feed` is given each piece received).
    The lines are Kestrel's ``VALUE <queue> 0 <length>``; any other line goes through
    :func:`parse_value_header`, so errors are mapped as for one value. ``stamped``: the stream
    was asked for enqueue times, ``VALUE <queue> 0 <length> <stamp>`` (a line without one, from
    a server that ignores the option, gives 0).

    Each piece is read where it lies and each value copied once, into the values' buffer
    (``into`` if given); only a block cut by a piece's end is kept apart, and made whole with
    as few of the next piece's bytes as it needs (ADR 0022)."""

    def __init__(self, command: str, key: bytes, limit: int, stamped: bool = False,
                 into: bytearray | None = None) -> None:
        self.command = command
        self.key = key
        self.limit = limit
        self.done = False
        # The values are written into ``into`` from its start, over what it held (a buffer a
        # committed batch used: its pages are already the process's, so filling it faults
        # none in), and :meth:`values` hands out a view of the part written, never the buffer.
        self._into = into is not None
        # One C-level match per item takes its whole header line (a planner scans 50,000 a batch)
        self._header = re.compile(re.escape(b"VALUE " + key + b" 0 ")
                                  + (rb"(\d+)(?: (\d+))?\r\n" if stamped else rb"(\d+)()\r\n"))
        self._stamped = stamped
        # What has been taken, whichever way: compiled, blocks of Kestrel's own form are taken
        # by its scan (ADR 0022) and the match takes only the rest (the final END, an error),
        # in order. Interpreted, that loop is slower than the match, which takes them all.
        self._taken = HeaderScan(b"VALUE " + key + b" 0 ", stamped,
                                 bytearray() if into is None else into)
        self._fast = _SCAN_COMPILED
        # the start of a block cut by the last piece's end, in the pieces it came in (a value
        # larger than a piece is joined once, when whole), and the bytes that make it whole
        # (0: not known yet, its header line is cut)
        self._pending: list[bytes] = []
        self._pending_size = 0
        self._wanted = 0

    def feed(self, piece: bytes) -> int:
        """Take ``piece``, the next bytes received; returns how many of them are this reply's:
        all of them until the final ``END`` (which sets :attr:`done`), whose following bytes
        are another reply's, left to the caller."""
        at = 0
        while self._pending:  # the cut block first, made whole from this piece's start
            size, wanted = self._pending_size, self._wanted
            if wanted and size + len(piece) - at < wanted:  # not whole yet
                self._pending.append(piece[at:] if at else piece)
                self._pending_size += len(piece) - at
                return len(piece)
            take = wanted - size if wanted else _LINE_STEP
            self._pending.append(piece[at:at + take])
            joined = b"".join(self._pending)
            pos = self._scan(joined, 0)
            if self.done or pos:  # past the cut block: go on in the piece itself
                at += pos - size
                self._pending, self._pending_size = [], 0
                if self.done:
                    return at
            else:  # its header line was cut: its length is known now, or more is needed
                at += len(joined) - size
                self._pending, self._pending_size = [joined], len(joined)
                if at >= len(piece):
                    return len(piece)
        pos = self._scan(piece, at)
        if not self.done:
            rest = piece[pos:]
            if rest:
                self._pending, self._pending_size = [rest], len(rest)
            return len(piece)
        return pos

    def _scan(self, buf: bytes, pos: int) -> int:
        """Take the whole blocks in ``buf`` from ``pos`` on; returns where they end (and sets
        :attr:`done` at the final ``END``, :attr:`_wanted` for a block it stops inside)."""
        taken = self._taken
        stamped = self._stamped
        header = self._header.match
        fast = self._fast
        tail = _TAIL
        size = len(buf)
        self._wanted = 0
        while True:
            if fast:
                pos = taken.scan(buf, pos)
                if taken.stopped == _SCAN_MORE:
                    self._wanted = taken.wanted
                    break
            found = header(buf, pos)
            if found is not None:
                start = found.end()
                digits, stamp = found.groups(b"0")
                length = int(digits)
            else:
                eol = buf.find(b"\r\n", pos)  # not a whole header of this queue: END, or an error
                if eol < 0:
                    break
                parsed = parse_value_header(self.command, buf[pos:eol], self.key)
                if parsed is None:
                    self.done = True
                    pos = eol + 2
                    break
                start, length, stamp = eol + 2, parsed, b"0"
            end = start + length
            if end + tail > size:
                self._wanted = end + tail - pos
                break
            if not buf.startswith(_VALUE_END, end):
                got = buf[end:end + tail]
                if not got.startswith(b"\r\n"):
                    raise UnexpectedReply(f"value of {length} bytes not followed by CRLF")
                raise UnexpectedReply(f"expected END after a value, got {got[2:]!r}")
            taken.add(length, int(stamp) if stamped else 0)
            taken.put(buf, start, end)
            pos = end + tail
        if taken.count > self.limit:
            raise UnexpectedReply(f"{self.command}: more than the {self.limit} items asked for")
        return pos

    @property
    def taken(self) -> int:
        """The values taken so far."""
        return self._taken.count

    def values(self) -> PackedValues:
        """What was scanned (once :attr:`done`; its buffer is handed over, not copied: a
        buffer given as ``into`` as a view, so that while the values live it cannot be
        resized, which is how a pool knows it is still in use)."""
        taken = self._taken
        used, data = taken.used, taken.data
        if self._into:
            values: bytearray | memoryview = memoryview(data)[:used]
        else:
            del data[used:]
            values = data
        return PackedValues(taken.packed_lengths(), values,
                            taken.packed_stamps() if self._stamped else None)


def parse_stored(command: str, line: bytes) -> bool:
    """``STORED`` → True, ``NOT_STORED`` (the queue refused it: full, or too large) → False."""
    if line == _STORED:
        return True
    if line == _NOT_STORED:
        return False
    raise reply_error(command, line)


def parse_stat(line: bytes) -> tuple[str, str] | None:
    """``STAT <name> <value>`` → (name, value); None for the final ``END``."""
    if line == _END:
        return None
    parts = name_from_wire(line).split(" ", 2)  # stat names hold queue names: UTF-8
    if len(parts) != 3 or parts[0] != "STAT":
        raise reply_error("stats", line)
    return parts[1], parts[2]


def parse_version(line: bytes) -> str:
    """``VERSION <text>`` → text."""
    if not line.startswith(b"VERSION "):
        raise reply_error("version", line)
    return line[8:].decode("latin-1")


def expect_end(command: str, line: bytes) -> None:
    """The reply must be ``END`` (confirm, flush, ``get q/close``, ``get q/abort``)."""
    if line != _END:
        raise reply_error(command, line)


def expect_deleted(line: bytes) -> None:
    """The reply to ``delete <q>`` must be ``DELETED``."""
    if line != _DELETED:
        raise reply_error("delete", line)


STATUSES = ("up", "readonly", "writeavoid", "quiescent")
"""The statuses ``status <name>`` may set (behaviour §7.2); ``down`` is only the server's own."""


def status_request(status: str | None = None) -> bytes:
    """``status`` (ask) or ``status <name>`` (set); ValueError for a name the server refuses."""
    if status is None:
        return b"status\r\n"
    if status.lower() not in STATUSES:
        raise ValueError(f"not a status: {status!r} (one of {', '.join(STATUSES)})")
    return b"status %s\r\n" % status.lower().encode()


def parse_status(line: bytes) -> str:
    """The answer to ``status``: ``UP``, ``READONLY``, ``WRITEAVOID`` or ``QUIESCENT``."""
    if line.upper() != line or not line.isalpha():
        raise reply_error("status", line)
    return line.decode("ascii")


__all__ += ["STATUSES", "expect_deleted", "expect_end", "parse_status", "status_request"]
