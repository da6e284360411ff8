"""Kestrel's text protocol (port 2222), sans I/O: bytes in, commands out; replies to bytes.

Framing follows Kestrel's ``TextCodec`` (behaviour §3): a request is a line ending at ``\\n``
(a ``\\r`` before it is dropped), decoded as queue names are (UTF-8, any bytes kept:
:func:`kestrel_actors.queue_name.name_from_wire`) and split on single spaces, with the command
lower-cased. A first line ending in ``:`` collects the following lines as items until
an empty line or until ``MAX_PUT_BUFFER`` items have been read; after that many, the next line
is taken as the terminator whatever it holds (Kestrel's quirk: the line is lost). Each item is
its line decoded ISO-8859-1 and re-encoded UTF-8, as Kestrel does, so bytes >= 0x80 grow.

Errors that need no server state are :class:`Bad` commands: most carry a ``-message`` reply
and keep the connection open (the text protocol never closes after an error); the DROP cases
(non-numeric ``monitor``/``confirm`` arguments, a line of only spaces, where Kestrel's codec
throws) close without a reply.
One limit Kestrel lacks guards the server: a line longer than ``max_line_bytes`` gets
``-Line too long.`` and a close.
"""

from __future__ import annotations

from ..queue_name import name_from_wire
from ._commands import Bad
from ._decoder import Decoder
from ._lines import STATUS_NAMES, TOO_LONG, int32_text, next_line
from ._text_commands import (
    TextConfirm,
    TextDelete,
    TextFlush,
    TextGet,
    TextMonitor,
    TextPut,
    TextQuit,
    TextShutdown,
    TextStatus,
    TextVersion,
)

__all__ = [
    "MAX_PUT_BUFFER",
    "TEXT_NOT_THAT_MANY",
    "TEXT_NO_ITEM",
    "TEXT_OP_DELETE",
    "TEXT_OP_FLUSH",
    "TEXT_OP_GET_ITEM",
    "TEXT_OP_MONITOR",
    "TEXT_OP_SET_ITEM",
    "TEXT_ZERO",
    "TextDecoder",
    "parse_text_request",
    "text_count",
    "text_error",
    "text_item",
    "text_string",
    "text_too_many_open",
    "text_unavailable",
]

MAX_PUT_BUFFER = 1024
"""Most items one ``put`` collects; the line after the last is swallowed as the terminator."""

# The ``<op>`` of ``-Server not available for operation <op>`` (Kestrel's method names).
TEXT_OP_SET_ITEM = "setItem"
TEXT_OP_GET_ITEM = "getItem"
TEXT_OP_MONITOR = "monitorUntil"
TEXT_OP_FLUSH = "flush"
TEXT_OP_DELETE = "delete"

TEXT_NO_ITEM = b"*\n"
TEXT_ZERO = b"+0\n"



def text_error(message: str) -> bytes:
    """``-<message>``; like Kestrel's ``getBytes("ascii")``, other characters become ``?``."""
    return b"-" + message.encode("ascii", "replace") + b"\n"


def text_count(count: int) -> bytes:
    """``+<count>``: a count or plain success."""
    return b"+%d\n" % count


def text_item(data: bytes | None) -> bytes:
    """``:<data>`` for an item (raw bytes), ``*`` for none."""
    if data is None:
        return TEXT_NO_ITEM
    return b":" + data + b"\n"


def text_string(value: str) -> bytes:
    """``:<value>`` for a string reply: ``version``, and ``status`` (pass it upper-cased)."""
    return b":" + value.encode("ascii", "replace") + b"\n"


def text_unavailable(op: str) -> bytes:
    """The reply when the server status (or a connection limit) blocks ``op``; stays open."""
    return text_error(f"Server not available for operation {op}")


def text_too_many_open(limit: int) -> bytes:
    """The reply of ``get`` when the open limit is reached (only possible with a limit of 0)."""
    return text_error(f"Too many open transactions; limit={limit}")


TEXT_NOT_THAT_MANY = text_error("Not that many transactions open.")

_QUEUE_REQUIRED = Bad(text_error("Queue name required."), close=False)
_BAD_EXPIRY = Bad(text_error("Error parsing expiration time."), close=False)
_BAD_TIMEOUT = Bad(text_error("Error parsing timeout."), close=False)
_MONITOR_ARGS = Bad(text_error("Queue name & timeout required."), close=False)
_CONFIRM_ARGS = Bad(text_error("Queue name & count required."), close=False)
_UNKNOWN_STATUS = Bad(text_error("Unknown status."), close=False)
_FORBIDDEN_STATUS = Bad(text_error("Status forbidden."), close=False)
_DROP = Bad(None, close=True)
_TOO_LONG = Bad(text_error("Line too long."), close=True)


def _split(line: str) -> list[str]:
    """Java's ``line.split(" ")``: single-space separators, trailing empty tokens dropped.

    An empty line gives ``[""]``; a line of spaces only gives ``[]`` (Java's quirk).
    """
    tokens = line.split(" ")
    while tokens and not tokens[-1]:
        tokens.pop()
    if not tokens and not line:
        return [""]
    return tokens


class _Refused(Exception):
    """An argument the request cannot have: ``answer`` is the :class:`Bad` it gets."""

    def __init__(self, answer: Bad) -> None:
        super().__init__()
        self.answer = answer


def _queue(args: list[str]) -> str:
    if not args:
        raise _Refused(_QUEUE_REQUIRED)
    return args[0]


def _optional_int32(args: list[str], bad: Bad) -> int | None:
    """The optional number after the queue name (``None`` when absent); ``bad`` answers one
    that is not a Java int."""
    if len(args) < 2:
        return None
    value = int32_text(args[1])
    if value is None:
        raise _Refused(bad)
    return value


def parse_text_request(tokens: list[str], items: tuple[bytes, ...] = ()) -> object:
    """Turn a tokenized text request (and the items of a ``:`` block) into a command."""
    try:
        return _parse(tokens, items)
    except _Refused as refused:
        return refused.answer


def _parse(tokens: list[str], items: tuple[bytes, ...]) -> object:
    if not tokens:  # Kestrel indexes an empty array: an exception, so no reply and a close
        return _DROP
    command = tokens[0].lower()
    args = tokens[1:]
    argc = len(args)
    if command == "put":
        return TextPut(_queue(args), _optional_int32(args, _BAD_EXPIRY), items)
    if command == "get" or command == "peek":
        queue = _queue(args)
        timeout = _optional_int32(args, _BAD_TIMEOUT)
        if timeout is not None and timeout <= 0:
            timeout = None
        return TextGet(queue, timeout, peek=command == "peek")
    if command == "monitor":
        if argc < 2:
            return _MONITOR_ARGS
        timeout = int32_text(args[1])
        return _DROP if timeout is None else TextMonitor(args[0], timeout)
    if command == "confirm":
        if argc < 2:
            return _CONFIRM_ARGS
        count = int32_text(args[1])
        return _DROP if count is None else TextConfirm(args[0], count)
    if command == "flush" or command == "delete":
        queue = _queue(args)
        return TextFlush(queue) if command == "flush" else TextDelete(queue)
    if command == "status":
        if argc < 1:
            return TextStatus(None)
        name = args[0].lower()
        if name in STATUS_NAMES:
            return TextStatus(name)
        return _FORBIDDEN_STATUS if name == "down" else _UNKNOWN_STATUS
    if command == "version":
        return TextVersion()
    if command == "shutdown":
        return TextShutdown()
    if command == "quit":
        return TextQuit()
    return Bad(text_error(f"Unknown command: {command}"), close=False)


class TextDecoder(Decoder):
    """Incremental text decoder (see :class:`Decoder`): request lines, and the item lines of a
    ``:`` block. An unfinished block is simply dropped when the connection ends."""

    __slots__ = ("_block", "_block_bytes", "max_line_bytes")

    def __init__(self, max_line_bytes: int = 64 * 1024) -> None:
        super().__init__()
        self.max_line_bytes = max_line_bytes
        self._block: tuple[list[str], list[bytes]] | None = None
        self._block_bytes = 0
        """The size of the items of an unfinished block: buffered input too."""

    @property
    def buffered(self) -> int:
        return self._kept + self._block_bytes

    def release(self) -> None:
        super().release()
        self._block = None
        self._block_bytes = 0

    def _decode(self, source: bytes | bytearray, commands: list[object]) -> int:
        pos = 0
        limit = self.max_line_bytes
        while True:
            line, pos = next_line(source, pos, limit)
            if type(line) is not bytes:
                if line is TOO_LONG:
                    commands.append(_TOO_LONG)
                break  # None: the line is not complete yet
            block = self._block
            if block is not None:
                tokens, items = block
                if not line or len(items) >= MAX_PUT_BUFFER:
                    self._block = None
                    self._block_bytes = 0
                    commands.append(parse_text_request(tokens, tuple(items)))
                else:
                    item = line.decode("latin-1").encode("utf-8")
                    items.append(item)
                    self._block_bytes += len(item)
                continue
            text = name_from_wire(line)
            if text.endswith(":"):
                self._block = (_split(text[:-1]), [])
                continue
            command = parse_text_request(_split(text))
            commands.append(command)
            if type(command) is Bad and command.close:
                break
        return pos
