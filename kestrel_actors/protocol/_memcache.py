"""Kestrel's memcache text protocol, sans I/O: bytes in, commands out; replies to bytes.

Framing follows naggati's ``MemcacheCodec`` (behaviour §2.1): a request line ends at ``\\n``
(a ``\\r`` before it is dropped) and is split on single spaces; a storage
command is followed by a data block of the declared length plus two bytes that are skipped
unchecked. Two limits Kestrel lacks guard the server: a line longer than ``max_line_bytes`` or
a declared length over ``max_item_bytes`` gets ``CLIENT_ERROR`` and a close, before anything of
that size is buffered.

Queue names (and the other tokens) are decoded by :func:`kestrel_actors.queue_name.name_from_wire`
and every reply that carries one is encoded back by its inverse, ``name_bytes``: a name is the
same bytes in a request, in a reply and as a file name (Kestrel decodes ISO-8859-1).

Errors are commands too (:class:`Bad`), emitted in stream order, so replies to the requests
before a bad one still go out before the connection closes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

from ..queue_name import name_bytes, name_from_wire
from ._commands import (
    Bad,
    Confirm,
    Delete,
    DumpConfig,
    DumpStats,
    Flush,
    FlushAll,
    FlushAllExpired,
    FlushExpired,
    Get,
    Monitor,
    Quit,
    Reload,
    Set,
    Shutdown,
    Stats,
    Status,
    Version,
)
from ._decoder import Decoder
from ._lines import STATUS_NAMES, TOO_LONG, bytes_between, int32, int32_text, line_at, next_line

__all__ = [
    "CLIENT_ERROR",
    "DELETED",
    "DROP",
    "END",
    "ERROR",
    "FLUSHED_ALL",
    "NOT_STORED",
    "RELOADED",
    "SERVER_ERROR",
    "STORED",
    "MemcacheDecoder",
    "ValueReplies",
    "count_reply",
    "expiry_from_exptime",
    "parse_get_key",
    "parse_request_line",
    "server_error",
    "stats_reply",
    "status_reply",
    "value_reply",
    "version_reply",
]

END: Final = b"END\r\n"
STORED: Final = b"STORED\r\n"
NOT_STORED: Final = b"NOT_STORED\r\n"
DELETED = b"DELETED\r\n"
ERROR = b"ERROR\r\n"
CLIENT_ERROR = b"CLIENT_ERROR\r\n"
SERVER_ERROR = b"SERVER_ERROR\r\n"
FLUSHED_ALL = b"Flushed all queues.\r\n"
RELOADED = b"Reloaded config.\r\n"


def server_error(message: str) -> bytes:
    """``SERVER_ERROR <message>``: the server could not do it (a journal write failed).

    Kestrel's own SERVER_ERROR carries no text; memcache's carries one, and Kestrel's clients
    retry on any SERVER_ERROR. Other characters than ASCII become ``?``.
    """
    return b"SERVER_ERROR " + message.encode("ascii", "replace") + b"\r\n"

CLIENT_ERROR_OPEN = Bad(CLIENT_ERROR, close=False)
CLIENT_ERROR_CLOSE: Final = Bad(CLIENT_ERROR, close=True)
DROP: Final = Bad(None, close=True)
"""Kestrel closes the connection without a reply (an uncaught exception in the handler)."""

_STORAGE: Final = frozenset((b"set", b"add", b"replace", b"append", b"prepend", b"cas"))

_LINES: Final[dict[bytes, Get | tuple[tuple[str, int], int]]] = {}
"""Parsed request lines by their bytes: clients repeat the same few (``get q/t=500``,
``set q 0 0 1024``). A ``get`` line maps to its :class:`Get`, never changed once made; a valid
``set`` line to (queue and expiry, data length)."""
_LINES_MAX = 4096
_VALUE_END: Final = b"\r\nEND\r\n"
_REPEAT_MAX: Final = 256
_GET_RUN: Final = 8
"""How many repeats of a connection's last ``get`` line the decoder knows with one comparison."""
"""The longest request line a decoder keeps as its connection's last ``set`` or ``get`` line."""
_NO_GET: Final = Get("")
_NO_DATA: Final = b""
"""A spare SET's data (``MemcacheDecoder.reuse``): its item's bytes are let go."""
STAMP: Final = b"stamp"
"""The option (a GET key's ``/stamp``, monitor's fifth token) that asks for enqueue times."""


def parse_get_key(key: str) -> Get | Bad:
    """Split ``q/opt/opt`` into a :class:`Get` (behaviour §2.5), or the error it earns."""
    timeout_ms = None
    is_open = is_close = is_abort = is_peek = is_stamp = False
    if "/" in key:
        segments = key.split("/")
        name = segments[0]
        for option in segments[1:]:
            if option.startswith("t="):
                timeout_ms = int32_text(option[2:])
                if timeout_ms is None:
                    return DROP
            elif option == "open":
                is_open = True
            elif option == "close":
                is_close = True
            elif option == "abort":
                is_abort = True
            elif option == "peek":
                is_peek = True
            elif option == "stamp":
                is_stamp = True
    else:
        name = key
    if (
        not name
        or ((is_peek or is_abort) and (is_open or is_close))
        or (is_peek and is_abort)
    ):
        return CLIENT_ERROR_CLOSE
    if timeout_ms is not None and timeout_ms <= 0:
        timeout_ms = None
    return Get(name, timeout_ms, is_open, is_close, is_abort, is_peek, is_stamp)


def _get(tokens: list[bytes]) -> object:
    if len(tokens) < 2:
        return CLIENT_ERROR_OPEN
    return parse_get_key(name_from_wire(tokens[1]))


def _delete(tokens: list[bytes]) -> object:
    return Delete(name_from_wire(tokens[1])) if len(tokens) >= 2 else CLIENT_ERROR_OPEN


def _flush(tokens: list[bytes]) -> object:
    return Flush(name_from_wire(tokens[1])) if len(tokens) >= 2 else CLIENT_ERROR_OPEN


def _monitor(tokens: list[bytes]) -> object:
    argc = len(tokens)
    if argc < 2:
        return CLIENT_ERROR_OPEN
    seconds = int32(tokens[2]) if argc > 2 else None
    max_items = int32(tokens[3]) if argc > 3 else None
    if seconds is None or (argc > 3 and max_items is None):
        return DROP
    # A fifth token is ignored by Kestrel; ``stamp`` is our option (behaviour §2.7).
    return Monitor(name_from_wire(tokens[1]), seconds, max_items, argc > 4 and tokens[4] == STAMP)


def _confirm(tokens: list[bytes]) -> object:
    if len(tokens) < 3:
        return CLIENT_ERROR_OPEN
    count = int32(tokens[2])
    if count is None:
        return DROP
    return Confirm(name_from_wire(tokens[1]), count)


def _dump_stats(tokens: list[bytes]) -> object:
    return DumpStats(tuple(name_from_wire(token) for token in tokens[1:]))


def _flush_expired(tokens: list[bytes]) -> object:
    return FlushExpired(name_from_wire(tokens[1])) if len(tokens) >= 2 else DROP


def _status(tokens: list[bytes]) -> object:
    if len(tokens) < 2:
        return Status(None)
    name = name_from_wire(tokens[1]).lower()
    return Status(name) if name in STATUS_NAMES else CLIENT_ERROR_CLOSE


def _alone(kind: Callable[[], object]) -> Callable[[list[bytes]], object]:
    """A command that takes no arguments (any given are ignored), made anew for each request."""
    return lambda _tokens: kind()


_REQUESTS: Final[dict[bytes, Callable[[list[bytes]], object]]] = {
    b"get": _get,
    b"gets": _get,
    b"delete": _delete,
    b"flush": _flush,
    b"monitor": _monitor,
    b"confirm": _confirm,
    b"stats": _alone(Stats),
    b"dump_stats": _dump_stats,
    b"version": _alone(Version),
    b"flush_all": _alone(FlushAll),
    b"flush_expired": _flush_expired,
    b"flush_all_expired": _alone(FlushAllExpired),
    b"status": _status,
    b"shutdown": _alone(Shutdown),
    b"reload": _alone(Reload),
    b"dump_config": _alone(DumpConfig),
    b"quit": _alone(Quit),
}
"""Each non-storage command (its first token, lower case), and what turns its tokens into a command."""


def parse_request_line(tokens: list[bytes]) -> object:
    """Turn the tokens of a non-storage request line into a command (behaviour §2.3)."""
    parse = _REQUESTS.get(tokens[0].lower())
    return CLIENT_ERROR_CLOSE if parse is None else parse(tokens)


def _storage_header(tokens: list[bytes]) -> tuple[str, int] | Bad:
    """What a storage line means once its data block has arrived (behaviour §2.4): the queue
    and expiry of a SET, or the error that replaces it (given after the data is consumed)."""
    if tokens[0].lower() != b"set":
        return CLIENT_ERROR_CLOSE
    exptime = int32(tokens[3])
    if exptime is None:
        return DROP
    if int32(tokens[2]) is None:
        return CLIENT_ERROR_OPEN
    return name_from_wire(tokens[1]), exptime


def _remember(line: bytes, parsed: Get | tuple[tuple[str, int], int]) -> None:
    if len(_LINES) >= _LINES_MAX:  # many distinct lines (queue names): start afresh
        _LINES.clear()
    _LINES[line] = parsed


class MemcacheDecoder(Decoder):
    """Incremental memcache decoder (see :class:`Decoder`): command lines, and a storage
    command's data block once all of it has arrived."""

    __slots__ = ("_get_line", "_get_parsed", "_get_run", "_get_runs", "_set_line", "_set_parsed", "_spare_set",
                 "_storage", "max_item_bytes", "max_line_bytes")

    def __init__(self, max_line_bytes: int = 64 * 1024, max_item_bytes: int = 64 * 1024 * 1024):
        super().__init__()
        self.max_line_bytes = max_line_bytes
        self.max_item_bytes = max_item_bytes
        self._storage: tuple[tuple[str, int] | Bad, int] | None = None
        # this connection's last set and get lines, their ends included, and what they mean: a
        # client repeats its lines, and :func:`line_at` knows one again without looking for its end
        self._set_line = b""
        self._set_parsed: tuple[tuple[str, int] | Bad, int] | None = None
        """Typed as ``_storage`` is: the compiled build copies a reference, and builds no tuple."""
        self._get_line = b""
        self._get_parsed = _NO_GET
        self._get_run = b"-"
        """``_get_line`` ``_GET_RUN`` times: a pipelined burst of the line is known a run at a
        time, one comparison for ``_GET_RUN`` requests."""
        self._get_runs: list[object] = [_NO_GET]
        """``_get_parsed`` ``_GET_RUN`` times: what a run of the line decodes to."""
        self._spare_set: Set | None = None
        """A SET this decoder made, answered and held by nobody (:meth:`reuse`): the next SET
        decoded is it, refilled."""

    def reuse(self, command: object) -> None:
        # a SET only: one is made per request and never shared (a ``get`` line's Get is, through
        # ``_LINES`` and the repeats); refilled, not made (~140 instructions) and freed (~145) per SET
        if type(command) is Set:
            command.data = _NO_DATA  # its item's bytes go now, not at the next SET
            self._spare_set = command

    def _decode(self, source: bytes | bytearray, commands: list[object]) -> int:
        pos = 0
        size = len(source)
        while True:
            if self._storage is not None:
                header, count = self._storage
                if size - pos < count + 2:
                    break
                if isinstance(header, Bad):
                    commands.append(header)
                else:
                    data = bytes_between(source, pos, pos + count)
                    spare = self._spare_set
                    if spare is None:
                        commands.append(Set(header[0], header[1], data))
                    else:
                        self._spare_set = None
                        spare.queue = header[0]
                        spare.exptime = header[1]
                        spare.data = data
                        commands.append(spare)
                pos += count + 2
                self._storage = None
                continue
            if pos >= size:
                break
            # the lines' lengths, not their truth: compiled, a bytes' length is native and its truth
            # a generic call (~25 instructions a read)
            repeated = self._set_line
            if len(repeated) and line_at(source, pos, repeated):
                self._storage = self._set_parsed
                pos += len(repeated)
                continue
            repeated = self._get_line
            if len(repeated):
                run = self._get_run
                if size - pos >= len(run) and line_at(source, pos, run):
                    commands.extend(self._get_runs)
                    pos += len(run)
                    continue
                if line_at(source, pos, repeated):
                    commands.append(self._get_parsed)
                    pos += len(repeated)
                    continue
            start = pos
            line, pos = next_line(source, pos, self.max_line_bytes)
            if type(line) is not bytes:
                if line is TOO_LONG:
                    commands.append(CLIENT_ERROR_CLOSE)
                break  # None: the line is not complete yet
            known = _LINES.get(line)
            if known is not None:
                if isinstance(known, Get):
                    commands.append(known)
                    if pos - start <= _REPEAT_MAX:
                        self._get_line = repeated = bytes_between(source, start, pos)
                        self._get_parsed = known
                        self._get_run = repeated * _GET_RUN
                        self._get_runs = [known] * _GET_RUN
                    continue
                if known[1] <= self.max_item_bytes:
                    self._storage = known
                    if pos - start <= _REPEAT_MAX:
                        self._set_line = bytes_between(source, start, pos)
                        self._set_parsed = known
                    continue
            tokens = line.split(b" ")
            while len(tokens) > 1 and not tokens[-1]:
                tokens.pop()
            if tokens[0].lower() in _STORAGE:
                if len(tokens) < 5:
                    commands.append(DROP)
                    break
                data_bytes = int32(tokens[4])
                if data_bytes is None or data_bytes < 0:
                    commands.append(DROP)
                    break
                if data_bytes > self.max_item_bytes:
                    commands.append(CLIENT_ERROR_CLOSE)
                    break
                header = _storage_header(tokens)
                self._storage = (header, data_bytes)
                if not isinstance(header, Bad):
                    _remember(line, (header, data_bytes))
                continue
            command = parse_request_line(tokens)
            commands.append(command)
            if type(command) is Get:
                _remember(line, command)
            elif type(command) is Bad and command.close:
                break
        return pos


def value_reply(queue: str, data: bytes) -> bytes:
    """``VALUE <queue> 0 <len>`` + data + ``END``: a hit on a GET or one monitor item."""
    return b"".join((_value_line(queue, len(data)), data, _VALUE_END))


def _value_line(queue: str, size: int) -> bytes:
    return b"VALUE " + name_bytes(queue) + b" 0 " + b"%d" % size + b"\r\n"


class ValueReplies:
    """:func:`value_reply` for one connection, keeping the last ``VALUE`` line it made: a client
    reads items of one size from one queue, and the line is then two comparisons instead of an
    encode and a format."""

    __slots__ = ("_joint", "_joint_line", "_line", "_queue", "_size", "_stamped_line_bytes", "_stamped_prefix",
                 "_stamped_queue", "_stamped_size", "_stamped_time")

    def __init__(self) -> None:
        self._queue = ""
        self._size = -1
        self._line = b""
        self._stamped_queue = ""
        self._stamped_prefix = b""
        self._stamped_size = -1
        self._stamped_time = -1
        self._stamped_line_bytes = b""
        self._joint_line = b""
        self._joint = b""
        """``END`` and then ``_joint_line``, one part (:meth:`add_stream_parts`)."""

    def reply(self, queue: str, data: bytes) -> bytes:
        return b"".join((self._value_line(queue, len(data)), data, _VALUE_END))

    def stamped(self, queue: str, data: bytes, add_time: int) -> bytes:
        """``VALUE <queue> 0 <len> <add_time>`` + data + ``END``: a hit asked for with the
        ``stamp`` option; the fifth field, where memcache's ``gets`` puts a cas number, is the
        item's enqueue time (epoch ms)."""
        return b"".join((self._stamped_line(queue, len(data), add_time), data, _VALUE_END))

    def add_parts(self, out: list[bytes], queue: str, data: bytes) -> None:
        """:meth:`reply`'s three parts appended to ``out``, not joined: a monitor stream's
        replies go out in one ``writev`` (``SocketTransport.send_parts``), and joining copied
        each item's data once more."""
        out.append(self._value_line(queue, len(data)))
        out.append(data)
        out.append(_VALUE_END)

    def add_hits(self, out: list[bytes], queue: str, datas: list[bytes | None]) -> None:
        """:meth:`add_parts` for each of ``datas`` in turn, or ``END`` for a ``None`` (a miss):
        the replies to a pipelined burst of one plain GET, in one loop that looks at the
        ``VALUE`` line once per change of item size. As in :meth:`add_stream_parts`, a hit's
        ``END`` and the next hit's ``VALUE`` line are one part: n hits in a row are 2n + 1
        parts, not 3n, for the sender to count and join."""
        size = -1
        line = b""
        follows = False  # the last part in ``out`` is a hit's data, its END still to come
        for data in datas:
            if data is None:
                if follows:
                    out.append(_VALUE_END)
                    follows = False
                out.append(END)
                continue
            if len(data) != size:
                size = len(data)
                line = self._value_line(queue, size)
            out.append(self._joined(line) if follows else line)
            out.append(data)
            follows = True
        if follows:
            out.append(_VALUE_END)

    def add_stamped_parts(self, out: list[bytes], queue: str, data: bytes, add_time: int) -> None:
        """:meth:`stamped`'s three parts appended to ``out`` (as :meth:`add_parts`)."""
        out.append(self._stamped_line(queue, len(data), add_time))
        out.append(data)
        out.append(_VALUE_END)

    def add_stream_parts(self, out: list[bytes], queue: str, data: bytes, add_time: int, stamped: bool,
                         follows: bool) -> None:
        """One reply of a monitor stream (stamped or not) appended to ``out`` as :meth:`add_parts`,
        except that with ``follows`` (the previous reply in ``out`` is one of these) that
        reply's ``END`` and this one's ``VALUE`` line go out as one part: a stream of n replies
        is 2n + 1 parts, not 3n, and every part costs the ``writev`` and the sender's
        bookkeeping. :meth:`end_stream` appends the last reply's ``END``."""
        line = self._stamped_line(queue, len(data), add_time) if stamped else self._value_line(queue, len(data))
        out.append(self._joined(line) if follows else line)
        out.append(data)

    def _joined(self, line: bytes) -> bytes:
        """The reply before's ``END`` and ``line`` as one part, kept while ``line`` repeats
        (items of one size and millisecond share it): a run of n replies is 2n + 1 parts."""
        if line is not self._joint_line:
            self._joint = _VALUE_END + line
            self._joint_line = line
        return self._joint

    @staticmethod
    def end_stream(out: list[bytes]) -> None:
        """The ``END`` of the last reply :meth:`add_stream_parts` appended."""
        out.append(_VALUE_END)

    def _value_line(self, queue: str, size: int) -> bytes:
        if size != self._size or queue != self._queue:
            self._line = _value_line(queue, size)
            self._queue = queue
            self._size = size
        return self._line

    def _stamped_line(self, queue: str, size: int, add_time: int) -> bytes:
        # a stream names its queue with one object: kept, the next line's check is by identity
        # (a string compared, and the prefix's truth asked generically, cost ~80 an item)
        if queue is not self._stamped_queue:
            if queue != self._stamped_queue or not self._stamped_prefix:
                self._stamped_prefix = b"VALUE " + name_bytes(queue) + b" 0 "
                self._stamped_size = -1
            self._stamped_queue = queue
        # items added in one millisecond (a burst of SETs, read back as a run) share the line
        if size != self._stamped_size or add_time != self._stamped_time:
            self._stamped_line_bytes = self._stamped_prefix + b"%d %d\r\n" % (size, add_time)
            self._stamped_size = size
            self._stamped_time = add_time
        return self._stamped_line_bytes


def stats_reply(lines: list[tuple[str, object]]) -> bytes:
    """``STAT <name> <value>`` lines joined by CRLF, then ``END``."""
    body = "".join(f"STAT {name} {value}\r\n" for name, value in lines)
    return name_bytes(body) + END


def expiry_from_exptime(exptime: int, now: int | None = None) -> int:
    """Memcache expiry to absolute epoch ms: 0 never, < 1e6 relative seconds, else absolute.

    ``now`` (epoch ms) is read from the clock only for a relative expiry, the rare case.
    """
    if exptime == 0:
        return 0
    if exptime < 1_000_000:
        return (int(time.time() * 1000) if now is None else now) + exptime * 1000
    return exptime * 1000


def count_reply(count: int) -> bytes:
    """A bare number line (flush_expired, flush_all_expired)."""
    return b"%d\r\n" % count


def version_reply(version: str) -> bytes:
    return b"VERSION %s\r\n" % version.encode()


def status_reply(name: str) -> bytes:
    """The reply to a bare ``status``: the server status's name."""
    return name.encode() + b"\r\n"
