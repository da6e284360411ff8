"""Kestrel's thrift protocol, sans I/O: framed transport + binary protocol (behaviour §4).

The IDL is Kestrel's own ``kestrel.thrift``, shipped beside this module and loaded at run time
by thriftpy2, so field ids, types and defaults come from the one file a client is generated
from. thriftpy2's binary protocol reads the argument structs and writes the result structs; the
framing (a 4-byte big-endian length, then the message) and the message header stay here, so
:class:`ThriftDecoder` takes bytes and returns call records, and the encoders return bytes.

Why the decoder walks every frame itself before thriftpy2 sees it: thriftpy2's readers trust
their input. Its Cython reader does not notice a frame that ends early (it reads zeroed or
stale bytes), takes a negative string length as a slice bound, and skips a container of
2**31 elements of a byte-less type one by one -- on the one hub that serves every client. The
walk (:func:`_walk_struct`) checks every length and count against the bytes left, every type
code, the nesting depth, and the type of each field the IDL names; only a frame that passes
is handed to thriftpy2, which then cannot go wrong.

Errors follow what Kestrel's server (Finagle + Scrooge 3) does where a client can tell, and
are records too (:class:`Bad`, emitted in stream order):

* a frame length below zero or over ``max_frame_bytes``, or a message header that cannot be
  read (too short, a bad version word): no reply, close -- there is no seqid to answer;
* an unknown method: ``TApplicationException(UNKNOWN_METHOD, "Invalid method name: 'x'")``;
* arguments that do not parse (truncated, a negative size, a field of the wrong type, a
  missing argument that has no default): ``TApplicationException(PROTOCOL_ERROR, ...)``.
  The frame boundary is known, so the connection stays open for the next call.

A call's message type is not checked (Scrooge does not either); strict and non-strict message
headers are both accepted (Java's ``TBinaryProtocol.Factory()`` reads both, Finagle sends
strict), and replies are always strict.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any, ClassVar

import thriftpy2
from thriftpy2 import protocol as _protocol
from thriftpy2 import transport as _transport
from thriftpy2.thrift import TApplicationException, TMessageType, TType

from ..queue_name import name_from_wire
from ._commands import Bad
from ._decoder import Decoder
from ._lines import bytes_between
from ._memcache import DROP  # no reply, close: what Finagle does when a read fails

TBinaryProtocol: Any = _protocol.TBinaryProtocol  # thriftpy2 has no type information
TMemoryBuffer: Any = _transport.TMemoryBuffer

__all__ = [
    "KESTREL_IDL",
    "ThriftAbort",
    "ThriftConfirm",
    "ThriftCurrentStatus",
    "ThriftDecoder",
    "ThriftDeleteQueue",
    "ThriftFlushAllQueues",
    "ThriftFlushQueue",
    "ThriftGet",
    "ThriftGetVersion",
    "ThriftItem",
    "ThriftPeek",
    "ThriftPut",
    "ThriftQueueInfo",
    "ThriftSetStatus",
    "ThriftStatus",
    "encode_thrift_exception",
    "encode_thrift_result",
]

KESTREL_IDL = thriftpy2.load_fp(
    io.StringIO(resources.files(__package__).joinpath("kestrel.thrift").read_text("utf-8")),
    module_name="kestrel_thrift",
)
"""Kestrel's IDL as a thriftpy2 module: ``KESTREL_IDL.Kestrel`` is the service, and the
``ThriftItem``/``ThriftQueueInfo``/``ThriftStatus`` names below are its types."""

ThriftItem = KESTREL_IDL.Item
ThriftQueueInfo = KESTREL_IDL.QueueInfo
ThriftStatus = KESTREL_IDL.Status

_SERVICE = KESTREL_IDL.Kestrel

DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024 + 64 * 1024
"""A 64 MiB item (the memcache ``max_item_bytes`` default) plus room for the message around it."""

_MAX_DEPTH = 64  # thriftpy2's own nesting limit: a frame we pass never trips it


# -- call records ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _ThriftCall:
    """One decoded call: ``seqid`` goes back in the reply; ``method`` is the IDL's name."""

    method: ClassVar[str] = ""
    seqid: int


@dataclass(frozen=True, slots=True)
class _QueueCall(_ThriftCall):
    queue: str


@dataclass(frozen=True, slots=True)
class ThriftPut(_QueueCall):
    """``put``: add ``items`` in order; ``expiration_msec`` 0 means never expire."""

    method: ClassVar[str] = "put"
    items: tuple[bytes, ...]
    expiration_msec: int


@dataclass(frozen=True, slots=True)
class ThriftGet(_QueueCall):
    """``get``: up to ``max_items``, waiting ``timeout_msec`` (0: no wait); opened under global
    ids with an abort timer when ``auto_abort_msec`` > 0. Values are as sent (the two times may
    be < 0; a negative ``max_items`` is a PROTOCOL_ERROR, never a call)."""

    method: ClassVar[str] = "get"
    max_items: int
    timeout_msec: int
    auto_abort_msec: int


@dataclass(frozen=True, slots=True)
class ThriftConfirm(_QueueCall):
    method: ClassVar[str] = "confirm"
    ids: frozenset[int]


@dataclass(frozen=True, slots=True)
class ThriftAbort(_QueueCall):
    method: ClassVar[str] = "abort"
    ids: frozenset[int]


@dataclass(frozen=True, slots=True)
class ThriftPeek(_QueueCall):
    method: ClassVar[str] = "peek"


@dataclass(frozen=True, slots=True)
class ThriftFlushQueue(_QueueCall):
    method: ClassVar[str] = "flush_queue"


@dataclass(frozen=True, slots=True)
class ThriftDeleteQueue(_QueueCall):
    method: ClassVar[str] = "delete_queue"


@dataclass(frozen=True, slots=True)
class ThriftFlushAllQueues(_ThriftCall):
    method: ClassVar[str] = "flush_all_queues"


@dataclass(frozen=True, slots=True)
class ThriftCurrentStatus(_ThriftCall):
    method: ClassVar[str] = "current_status"


@dataclass(frozen=True, slots=True)
class ThriftGetVersion(_ThriftCall):
    method: ClassVar[str] = "get_version"


@dataclass(frozen=True, slots=True)
class ThriftSetStatus(_ThriftCall):
    """``set_status``: ``status`` is a :data:`ThriftStatus` value (checked to be one)."""

    method: ClassVar[str] = "set_status"
    status: int


# -- encoders ----------------------------------------------------------------------------------


def _message(name: str, message_type: int, seqid: int, body: object) -> bytes:
    buffer = TMemoryBuffer()
    protocol = TBinaryProtocol(buffer)  # strict write, as Java's factory
    protocol.write_message_begin(name, message_type, seqid)
    protocol.write_struct(body)
    payload: bytes = buffer.getvalue()
    return len(payload).to_bytes(4, "big") + payload


def encode_thrift_result(call: _ThriftCall, success: object = None) -> bytes:
    """The framed REPLY to ``call``: ``success`` is the method's return value (an int for
    put/confirm/abort, a list of :data:`ThriftItem` for get, a :data:`ThriftQueueInfo` for
    peek, a :data:`ThriftStatus` value, the version string; ``None`` for the void methods)."""
    result = _RESULTS[call.method]()
    if success is not None:
        result.success = success
    return _message(call.method, TMessageType.REPLY, call.seqid, result)


def encode_thrift_exception(name: str, seqid: int, kind: int, message: str) -> bytes:
    """A framed ``TApplicationException`` reply; ``kind`` is one of its type codes."""
    return _message(name, TMessageType.EXCEPTION, seqid, TApplicationException(kind, message))


# -- decoder -----------------------------------------------------------------------------------

class _Malformed(Exception):
    """Bytes that are not what the binary protocol (or the IDL) allows; the text says why."""


def _int(frame: bytes, pos: int, width: int, end: int) -> int:
    if pos + width > end:
        raise _Malformed("message truncated")
    return int.from_bytes(frame[pos : pos + width], "big", signed=True)


_FIXED = {
    TType.BOOL: 1,
    TType.BYTE: 1,
    TType.I16: 2,
    TType.I32: 4,
    TType.DOUBLE: 8,
    TType.I64: 8,
}
_WIRE = {TType.BINARY: TType.STRING}  # thriftpy2 names binary apart; the wire does not


def _wire(ttype: int) -> int:
    return _WIRE.get(ttype, ttype)


def _walk(frame: bytes, pos: int, end: int, ttype: int, depth: int) -> int:
    """Where the value of ``ttype`` at ``pos`` ends, checking every size against ``end``."""
    size = _FIXED.get(ttype)
    if size is not None:
        if pos + size > end:
            raise _Malformed("message truncated")
        return pos + size
    if ttype == TType.STRING:
        length = _int(frame, pos, 4, end)
        if length < 0:
            raise _Malformed("negative string length")
        if pos + 4 + length > end:
            raise _Malformed("message truncated")
        return pos + 4 + length
    if depth <= 0:
        raise _Malformed("nesting too deep")
    if ttype == TType.STRUCT:
        return _walk_struct(frame, pos, end, None, depth - 1)
    if ttype in (TType.LIST, TType.SET):
        element = _int(frame, pos, 1, end)
        count = _int(frame, pos + 1, 4, end)
        pos += 5
        return _walk_elements(frame, pos, end, (element,), count, depth - 1)
    if ttype == TType.MAP:
        key = _int(frame, pos, 1, end)
        value = _int(frame, pos + 1, 1, end)
        count = _int(frame, pos + 2, 4, end)
        pos += 6
        return _walk_elements(frame, pos, end, (key, value), count, depth - 1)
    raise _Malformed(f"unknown type {ttype}")


def _walk_elements(
    frame: bytes, pos: int, end: int, types: tuple[int, ...], count: int, depth: int
) -> int:
    if count < 0:
        raise _Malformed("negative container size")
    if count > end - pos:  # every element takes at least one byte
        raise _Malformed("message truncated")
    for ttype in types:
        if ttype not in _FIXED and ttype not in (
            TType.STRING, TType.STRUCT, TType.LIST, TType.SET, TType.MAP
        ):
            raise _Malformed(f"unknown type {ttype}")
    for _ in range(count):
        for ttype in types:
            pos = _walk(frame, pos, end, ttype, depth)
    return pos


def _walk_struct(frame: bytes, pos: int, end: int, spec: dict[int, Any] | None, depth: int) -> int:
    """Walk a struct to its STOP; fields that ``spec`` (a thriftpy2 ``thrift_spec``) names
    must carry its type, and a list or set field its element type."""
    while True:
        ftype = _int(frame, pos, 1, end)
        pos += 1
        if ftype == TType.STOP:
            return pos
        fid = _int(frame, pos, 2, end)
        pos += 2
        known = spec.get(fid) if spec is not None else None
        if known is not None:
            name = known[1]
            if ftype != _wire(known[0]):
                raise _Malformed(f"wrong type for field {name}")
            if ftype in (TType.LIST, TType.SET) and isinstance(known[2], int):
                element = _int(frame, pos, 1, end)
                if element != _wire(known[2]):
                    raise _Malformed(f"wrong element type for field {name}")
        pos = _walk(frame, pos, end, ftype, depth)


def _header(frame: bytes) -> tuple[str, int, int]:
    """Method name, seqid and where the arguments start; strict or non-strict."""
    end = len(frame)
    word = _int(frame, 0, 4, end)
    if word < 0:
        if word & -65536 != -2147418112:  # VERSION_MASK, VERSION_1
            raise _Malformed("bad version")
        length = _int(frame, 4, 4, end)
        start = 8
    else:
        length = word
        start = 4
    if length < 0 or start + length > end:
        raise _Malformed("message truncated")
    name = frame[start : start + length].decode("utf-8", "replace")
    pos = start + length + (0 if word < 0 else 1)  # non-strict: a type byte after the name
    seqid = _int(frame, pos, 4, end)
    return name, seqid, pos + 4


def _required(args: object, field: str) -> Any:
    value = getattr(args, field)
    if value is None:
        raise _Malformed(f"missing {field}")
    return value


def _i32(args: object, field: str) -> int:
    value: int | None = getattr(args, field)
    return 0 if value is None else value  # the JVM's default for an unset primitive


def _put(seqid: int, args: object) -> ThriftPut:
    return ThriftPut(
        seqid,
        name_from_wire(_required(args, "queue_name")),
        tuple(_required(args, "items")),
        _i32(args, "expiration_msec"),
    )


def _get(seqid: int, args: object) -> ThriftGet:
    max_items = _i32(args, "max_items")
    if max_items < 0:  # Kestrel read it as "no limit"; answered as an error, nothing removed (issue 21.6)
        raise _Malformed(f"max_items must not be negative ({max_items})")
    return ThriftGet(
        seqid,
        name_from_wire(_required(args, "queue_name")),
        max_items,
        _i32(args, "timeout_msec"),
        _i32(args, "auto_abort_msec"),
    )


def _ids(record: type[ThriftConfirm | ThriftAbort]) -> _Builder:
    def build(seqid: int, args: object) -> ThriftConfirm | ThriftAbort:
        queue = name_from_wire(_required(args, "queue_name"))
        return record(seqid, queue, frozenset(_required(args, "ids")))

    return build


def _queue(record: type[_QueueCall]) -> _Builder:
    def build(seqid: int, args: object) -> _QueueCall:
        return record(seqid, name_from_wire(_required(args, "queue_name")))

    return build


def _bare(record: type[_ThriftCall]) -> _Builder:
    def build(seqid: int, args: object) -> _ThriftCall:
        return record(seqid)

    return build


def _set_status(seqid: int, args: object) -> ThriftSetStatus:
    status = _required(args, "status")
    if status not in ThriftStatus._VALUES_TO_NAMES:
        raise _Malformed(f"unknown status {status}")
    return ThriftSetStatus(seqid, status)


_Builder = Callable[[int, Any], _ThriftCall]

_BUILDERS: dict[str, _Builder] = {
    "put": _put,
    "get": _get,
    "confirm": _ids(ThriftConfirm),
    "abort": _ids(ThriftAbort),
    "peek": _queue(ThriftPeek),
    "flush_queue": _queue(ThriftFlushQueue),
    "flush_all_queues": _bare(ThriftFlushAllQueues),
    "delete_queue": _queue(ThriftDeleteQueue),
    "current_status": _bare(ThriftCurrentStatus),
    "set_status": _set_status,
    "get_version": _bare(ThriftGetVersion),
}
_ARGS = {name: getattr(_SERVICE, f"{name}_args") for name in _SERVICE.thrift_services}
_RESULTS = {name: getattr(_SERVICE, f"{name}_result") for name in _SERVICE.thrift_services}
assert _BUILDERS.keys() == _ARGS.keys(), "every method of the IDL has a call record"


def decode_frame(frame: bytes) -> object:
    """One frame's call record, or the :class:`Bad` that answers it."""
    try:
        name, seqid, pos = _header(frame)
    except _Malformed:
        return DROP
    build = _BUILDERS.get(name)
    if build is None:
        reply = encode_thrift_exception(
            name, seqid, TApplicationException.UNKNOWN_METHOD, f"Invalid method name: '{name}'"
        )
        return Bad(reply, close=False)
    args_type = _ARGS[name]
    try:
        _walk_struct(frame, pos, len(frame), args_type.thrift_spec, _MAX_DEPTH - 1)
        args = args_type()
        TBinaryProtocol(TMemoryBuffer(frame[pos:]), decode_response=False).read_struct(args)
        return build(seqid, args)
    except _Malformed as error:
        message = str(error)
    except Exception as error:  # noqa: BLE001 -- bad input must never escape feed()
        message = f"malformed arguments ({type(error).__name__})"
    reply = encode_thrift_exception(name, seqid, TApplicationException.PROTOCOL_ERROR, message)
    return Bad(reply, close=False)


class ThriftDecoder(Decoder):
    """Incremental thrift decoder (see :class:`Decoder`): one call record per complete frame.

    A frame whose declared length is negative or over ``max_frame_bytes`` is refused before
    anything of that size is buffered.
    """

    __slots__ = ("max_frame_bytes",)

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        super().__init__()
        self.max_frame_bytes = max_frame_bytes

    def _decode(self, source: bytes | bytearray, commands: list[object]) -> int:
        pos = 0
        size = len(source)
        while size - pos >= 4:
            length = int.from_bytes(source[pos : pos + 4], "big", signed=True)
            if length < 0 or length > self.max_frame_bytes:
                commands.append(DROP)
                break
            if size - pos - 4 < length:
                break
            call = decode_frame(bytes_between(source, pos + 4, pos + 4 + length))
            pos += 4 + length
            commands.append(call)
            if type(call) is Bad and call.close:
                break
        return pos
