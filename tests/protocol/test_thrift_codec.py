"""The sans-I/O thrift codec (behaviour §4): Kestrel's IDL, framing, every method's call record,
every method's reply, and bad frames -- which give an error record, never an exception.

Calls are encoded and replies decoded by thriftpy2's client side (through
``kestrel_actors.client.thrift``), never by the codec under test. A socket-level test of the
server needs the session handler, which is not wired yet (ADR 0004).
"""

from __future__ import annotations

import hashlib
import random
import struct
import subprocess
import sys

import pytest
from thriftpy2.protocol import TBinaryProtocol
from thriftpy2.thrift import TApplicationException, TMessageType, TType
from thriftpy2.transport import TMemoryBuffer

from kestrel_actors import protocol as p
from kestrel_actors.client.thrift import Item, QueueInfo, Status, decode_reply, encode_call
from kestrel_actors.protocol import ThriftDecoder, encode_thrift_exception, encode_thrift_result
from kestrel_actors.queue_name import name_from_wire

KESTREL_GIT = "/work/.mirror/twitter-archive+kestrel/repo"

# (method, its arguments, the call record the codec must produce for seqid 7)
CALLS = [
    (
        "put",
        {"queue_name": "jobs", "items": [b"a", b"", b"\x00\xff" * 300], "expiration_msec": 250},
        p.ThriftPut(7, "jobs", (b"a", b"", b"\x00\xff" * 300), 250),
    ),
    ("put", {"queue_name": "jobs", "items": [b"x"]}, p.ThriftPut(7, "jobs", (b"x",), 0)),
    (
        "get",
        {"queue_name": "jobs", "max_items": 10, "timeout_msec": 500, "auto_abort_msec": 3000},
        p.ThriftGet(7, "jobs", 10, 500, 3000),
    ),
    ("get", {"queue_name": "jobs", "max_items": 1}, p.ThriftGet(7, "jobs", 1, 0, 0)),
    ("get", {"queue_name": "jobs", "max_items": 0, "timeout_msec": -1}, p.ThriftGet(7, "jobs", 0, -1, 0)),
    (
        "confirm",
        {"queue_name": "jobs", "ids": {1, 2, 2**40}},
        p.ThriftConfirm(7, "jobs", frozenset({1, 2, 2**40})),
    ),
    ("abort", {"queue_name": "jobs", "ids": set()}, p.ThriftAbort(7, "jobs", frozenset())),
    ("peek", {"queue_name": "café"}, p.ThriftPeek(7, "café")),
    ("flush_queue", {"queue_name": "jobs"}, p.ThriftFlushQueue(7, "jobs")),
    ("flush_all_queues", {}, p.ThriftFlushAllQueues(7)),
    ("delete_queue", {"queue_name": "jobs"}, p.ThriftDeleteQueue(7, "jobs")),
    ("current_status", {}, p.ThriftCurrentStatus(7)),
    ("set_status", {"status": Status.READ_ONLY}, p.ThriftSetStatus(7, Status.READ_ONLY)),
    ("get_version", {}, p.ThriftGetVersion(7)),
]


def frame(body: bytes) -> bytes:
    return struct.pack("!i", len(body)) + body


def header(name: str, seqid: int = 7, strict: bool = True) -> bytes:
    encoded = name.encode()
    if strict:
        return struct.pack("!ii", -2147418112 | TMessageType.CALL, len(encoded)) + encoded + (
            struct.pack("!i", seqid)
        )
    return struct.pack("!i", len(encoded)) + encoded + struct.pack("!bi", TMessageType.CALL, seqid)


def string_field(fid: int, value: bytes) -> bytes:
    return struct.pack("!bhi", TType.STRING, fid, len(value)) + value


STOP = b"\x00"


def exception_of(record: object) -> TApplicationException:
    assert type(record) is p.Bad and record.close is False and record.reply
    _seqid, error = decode_reply("put", record.reply)
    assert isinstance(error, TApplicationException)
    return error


KESTREL_IDL_SHA256 = "8a6b565fbb153fa7525ab67ead9449e390d01815194dbca4957417d2cf372d5a"
"""sha256 of ``src/main/thrift/kestrel.thrift`` in twitter-archive/kestrel at cc280ec."""


def test_the_shipped_idl_is_kestrels_file_verbatim():
    from importlib import resources

    shipped = resources.files("kestrel_actors.protocol").joinpath("kestrel.thrift").read_bytes()
    # checked on every machine (a fresh clone has no Kestrel sources): the file's digest
    assert hashlib.sha256(shipped).hexdigest() == KESTREL_IDL_SHA256
    try:
        original = subprocess.run(
            ["git", f"--git-dir={KESTREL_GIT}", "show", "HEAD:src/main/thrift/kestrel.thrift"],
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return  # the digest above is the check
    assert shipped == original


def test_idl_has_kestrels_methods_and_field_ids():
    service = p.KESTREL_IDL.Kestrel
    assert service.thrift_services == [
        "put", "get", "confirm", "abort", "peek", "flush_queue", "flush_all_queues",
        "delete_queue", "current_status", "set_status", "get_version",
    ]
    assert {f: s[1] for f, s in service.get_args.thrift_spec.items()} == {
        1: "queue_name", 2: "max_items", 3: "timeout_msec", 4: "auto_abort_msec",
    }
    assert [s[1] for s in QueueInfo.thrift_spec.values()] == [
        "head_item", "items", "bytes", "journal_bytes", "age", "waiters", "open_transactions",
    ]
    assert (Status.NOT_CONFIGURED, Status.QUIESCENT, Status.READ_ONLY, Status.UP) == (0, 1, 2, 3)


@pytest.mark.parametrize(("method", "args", "record"), CALLS, ids=[c[0] for c in CALLS])
def test_every_method_decodes_whole_and_byte_by_byte(method, args, record):
    data = encode_call(method, 7, **args)
    assert ThriftDecoder().feed(data) == [record]
    decoder = ThriftDecoder()
    out: list[object] = []
    for i in range(len(data)):
        out += decoder.feed(data[i : i + 1])
        if i < len(data) - 1:
            assert out == []
    assert out == [record]


def test_pipelined_calls_in_one_chunk_and_split_at_every_byte():
    stream = b"".join(encode_call(m, 7, **a) for m, a, _ in CALLS)
    expected = [record for _, _, record in CALLS]
    assert ThriftDecoder().feed(stream) == expected
    for cut in range(0, len(stream), 7):
        decoder = ThriftDecoder()
        assert decoder.feed(stream[:cut]) + decoder.feed(stream[cut:]) == expected


def test_non_strict_message_header_is_accepted():
    body = header("peek", 12, strict=False) + string_field(1, b"q") + STOP
    assert ThriftDecoder().feed(frame(body)) == [p.ThriftPeek(12, "q")]


def test_strict_header_built_by_hand_matches_thriftpy2():
    body = header("peek", 7) + string_field(1, b"jobs") + STOP
    assert frame(body) == encode_call("peek", 7, queue_name="jobs")


def test_unknown_fields_are_skipped():
    nested = struct.pack("!bh", TType.STRUCT, 9) + struct.pack("!bhi", TType.I32, 1, 5) + STOP
    listed = struct.pack("!bhbi", TType.LIST, 10, TType.I64, 2) + struct.pack("!qq", 1, 2)
    mapped = struct.pack("!bhbbi", TType.MAP, 11, TType.STRING, TType.BOOL, 1)
    mapped += struct.pack("!i", 1) + b"k" + b"\x01"
    body = header("peek") + nested + listed + mapped + string_field(1, b"q") + STOP
    assert ThriftDecoder().feed(frame(body)) == [p.ThriftPeek(7, "q")]


def test_binary_queue_name_is_decoded_by_the_one_name_rule():
    # the same str a memcache or text client sending these bytes names (kestrel_actors.queue_name)
    body = header("peek") + string_field(1, b"q\xff") + STOP
    assert ThriftDecoder().feed(frame(body)) == [p.ThriftPeek(7, name_from_wire(b"q\xff"))]


# -- replies, read back by thriftpy2's client side -----------------------------------------------

RESULTS = [
    (p.ThriftPut(3, "q", (b"a",), 0), 1, 1),
    (p.ThriftGet(3, "q", 2, 0, 0), [], []),
    (
        p.ThriftGet(3, "q", 2, 0, 100),
        [Item(data=b"one", id=1), Item(data=b"\x00" * 70000, id=2**33)],
        [Item(data=b"one", id=1), Item(data=b"\x00" * 70000, id=2**33)],
    ),
    (p.ThriftConfirm(3, "q", frozenset({1})), 1, 1),
    (p.ThriftAbort(3, "q", frozenset({1, 2})), 0, 0),
    (
        p.ThriftPeek(3, "q"),
        QueueInfo(b"head", 10, 10240, 29999, 500, 2, 1),
        QueueInfo(b"head", 10, 10240, 29999, 500, 2, 1),
    ),
    (
        p.ThriftPeek(3, "q"),
        QueueInfo(None, 0, 0, 0, 0, 0, 0),
        QueueInfo(None, 0, 0, 0, 0, 0, 0),
    ),
    (p.ThriftFlushQueue(3, "q"), None, None),
    (p.ThriftFlushAllQueues(3), None, None),
    (p.ThriftDeleteQueue(3, "q"), None, None),
    (p.ThriftCurrentStatus(3), Status.UP, Status.UP),
    (p.ThriftCurrentStatus(3), Status.NOT_CONFIGURED, Status.NOT_CONFIGURED),
    (p.ThriftSetStatus(3, Status.UP), None, None),
    (p.ThriftGetVersion(3), "0.1.0", "0.1.0"),
]


@pytest.mark.parametrize(
    ("call", "value", "expected"), RESULTS, ids=[type(r[0]).__name__ for r in RESULTS]
)
def test_every_result_is_read_back_by_a_thrift_client(call, value, expected):
    reply = encode_thrift_result(call, value)
    assert decode_reply(call.method, reply) == (3, expected)


def test_exception_reply_is_read_back_by_a_thrift_client():
    reply = encode_thrift_exception("put", 9, TApplicationException.INTERNAL_ERROR, "no")
    seqid, error = decode_reply("put", reply)
    assert seqid == 9
    assert (error.type, error.message) == (TApplicationException.INTERNAL_ERROR, "no")


def test_replies_use_a_strict_header_of_type_reply():
    reply = encode_thrift_result(p.ThriftGetVersion(5), "v")
    protocol = TBinaryProtocol(TMemoryBuffer(reply[4:]), strict_read=True)
    assert protocol.read_message_begin() == ("get_version", TMessageType.REPLY, 5)
    assert struct.unpack("!i", reply[:4])[0] == len(reply) - 4


# -- bad frames --------------------------------------------------------------------------------

DROP = p.Bad(None, close=True)
VALID = encode_call("peek", 8, queue_name="after")


def test_negative_frame_size_closes_and_later_input_is_ignored():
    decoder = ThriftDecoder()
    assert decoder.feed(VALID + struct.pack("!i", -1) + VALID) == [p.ThriftPeek(8, "after"), DROP]
    assert decoder.closed
    assert decoder.feed(VALID) == []


def test_oversized_frame_closes_before_it_is_buffered():
    decoder = ThriftDecoder(max_frame_bytes=1000)
    assert decoder.feed(struct.pack("!i", 1001)) == [DROP]
    assert ThriftDecoder(max_frame_bytes=1000).feed(struct.pack("!i", 2**31 - 1)) == [DROP]
    small = encode_call("put", 1, queue_name="q", items=[b"x" * 900])
    assert len(small) - 4 <= 1000
    assert type(ThriftDecoder(max_frame_bytes=1000).feed(small)[0]) is p.ThriftPut


def test_default_frame_limit_admits_a_64_mib_item():
    decoder = ThriftDecoder()
    item = b"z" * (64 * 1024 * 1024)
    [record] = decoder.feed(encode_call("put", 1, queue_name="big", items=[item]))
    assert record == p.ThriftPut(1, "big", (item,), 0)


def test_incomplete_frame_waits_for_the_rest():
    decoder = ThriftDecoder()
    assert decoder.feed(VALID[:2]) == []
    assert decoder.feed(VALID[2:-1]) == []
    assert decoder.feed(VALID[-1:]) == [p.ThriftPeek(8, "after")]


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"\x80\x01",
        header("peek")[:-2],
        struct.pack("!ii", -2147418112 | 1, 50) + b"peek",  # name longer than the frame
        struct.pack("!ii", -2147418112 | 1, -3) + b"peek",  # negative name length
        struct.pack("!ii", -2147352576 | 1, 4) + b"peek" + struct.pack("!i", 1),  # version 2
        struct.pack("!i", 4) + b"peek",  # non-strict without type and seqid
    ],
    ids=["empty", "short", "no-seqid", "long-name", "negative-name", "bad-version", "nonstrict"],
)
def test_unreadable_message_header_closes(body):
    decoder = ThriftDecoder()
    assert decoder.feed(frame(body) + VALID) == [DROP]
    assert decoder.closed


def test_unknown_method_gets_unknown_method_exception_and_the_connection_goes_on():
    body = header("enqueue", 41) + string_field(1, b"q") + STOP
    decoder = ThriftDecoder()
    bad, good = decoder.feed(frame(body) + VALID)
    seqid, error = decode_reply("enqueue", bad.reply)
    assert bad.close is False and seqid == 41
    assert (error.type, error.message) == (
        TApplicationException.UNKNOWN_METHOD,
        "Invalid method name: 'enqueue'",
    )
    assert good == p.ThriftPeek(8, "after")


def protocol_error(body: bytes) -> str:
    """Feed one frame then a valid one; the first must be a PROTOCOL_ERROR reply."""
    bad, good = ThriftDecoder().feed(frame(body) + VALID)
    error = exception_of(bad)
    assert error.type == TApplicationException.PROTOCOL_ERROR
    assert good == p.ThriftPeek(8, "after")
    return error.message


def test_truncated_struct_gets_protocol_error():
    whole = encode_call("put", 7, queue_name="q", items=[b"abc", b"def"])[4:]
    for cut in range(len(header("put")), len(whole)):
        assert protocol_error(whole[:cut]) == "message truncated"


def test_wrong_type_for_a_field_gets_protocol_error():
    body = header("put") + struct.pack("!bhi", TType.I32, 1, 5) + STOP
    assert protocol_error(body) == "wrong type for field queue_name"
    body = header("get") + string_field(1, b"q") + string_field(2, b"ten") + STOP
    assert protocol_error(body) == "wrong type for field max_items"


def test_wrong_element_type_gets_protocol_error():
    body = header("confirm") + string_field(1, b"q")
    body += struct.pack("!bhbi", TType.SET, 2, TType.I32, 1) + struct.pack("!i", 3) + STOP
    assert protocol_error(body) == "wrong element type for field ids"


def test_missing_argument_without_default_gets_protocol_error():
    assert protocol_error(header("peek") + STOP) == "missing queue_name"
    assert protocol_error(header("put") + string_field(1, b"q") + STOP) == "missing items"
    assert protocol_error(header("confirm") + string_field(1, b"q") + STOP) == "missing ids"
    assert protocol_error(header("set_status") + STOP) == "missing status"


def test_missing_max_items_is_zero_as_on_the_jvm():
    body = header("get") + string_field(1, b"q") + STOP
    assert ThriftDecoder().feed(frame(body)) == [p.ThriftGet(7, "q", 0, 0, 0)]


def test_negative_max_items_gets_protocol_error():
    """Kestrel read a negative ``max_items`` as "no limit"; here it is refused (issue 21.6)."""
    for max_items in (-1, -(2**31)):
        body = encode_call("get", 7, queue_name="q", max_items=max_items, auto_abort_msec=1000)[4:]
        assert protocol_error(body) == f"max_items must not be negative ({max_items})"


def test_status_outside_the_enum_gets_protocol_error():
    body = header("set_status") + struct.pack("!bhi", TType.I32, 1, 9) + STOP
    assert protocol_error(body) == "unknown status 9"


def test_negative_sizes_get_protocol_error():
    body = header("peek") + struct.pack("!bhi", TType.STRING, 1, -5) + STOP
    assert protocol_error(body) == "negative string length"
    body = header("put") + string_field(1, b"q")
    body += struct.pack("!bhbi", TType.LIST, 2, TType.STRING, -1) + STOP
    assert protocol_error(body) == "negative container size"


def test_huge_container_counts_are_refused_without_walking_them():
    # 2**31-1 elements of a byte-less type: thriftpy2's skip would spin ~7 s (far longer
    # without its Cython extension)
    body = header("peek") + struct.pack("!bhbi", TType.LIST, 9, TType.STOP, 2**31 - 1) + STOP
    assert protocol_error(body) == "message truncated"
    body = header("peek") + struct.pack("!bhbi", TType.LIST, 9, TType.VOID, 1) + b"\x00" + STOP
    assert protocol_error(body) == "unknown type 1"
    body = header("put") + string_field(1, b"q")
    body += struct.pack("!bhbi", TType.LIST, 2, TType.STRING, 2**31 - 1) + STOP
    assert protocol_error(body) == "message truncated"


def test_unknown_field_type_gets_protocol_error():
    body = header("peek") + struct.pack("!bh", 99, 5) + STOP
    assert protocol_error(body) == "unknown type 99"


def test_deep_nesting_gets_protocol_error():
    depth = 200
    body = header("peek") + struct.pack("!bh", TType.STRUCT, 9) * depth + STOP * (depth + 1)
    assert protocol_error(body) == "nesting too deep"


def test_random_garbage_never_raises():
    rng = random.Random(13)
    seeds = [encode_call(m, 7, **a) for m, a, _ in CALLS]
    for _ in range(3000):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(4, len(data))] = rng.randrange(256)
        decoder = ThriftDecoder(max_frame_bytes=1 << 20)
        for record in decoder.feed(bytes(data)):
            assert isinstance(record, (p.Bad, *(type(c[2]) for c in CALLS)))
    for _ in range(500):
        noise = bytes(rng.randrange(256) for _ in range(rng.randint(0, 64)))
        ThriftDecoder(max_frame_bytes=1 << 20).feed(struct.pack("!i", len(noise)) + noise)


def test_the_package_imports_the_thrift_codec_only_when_a_thrift_name_is_used():
    """``kestrel_actors.protocol`` offers the codec's names without importing it (Kestrel's IDL
    costs ~0.1 s to load): the Python client, and every Spark process that reads a queue
    through it, never load it; the first thrift name does."""
    from kestrel_actors.protocol import thrift as _thrift

    assert all(getattr(p, name) is getattr(_thrift, name) for name in _thrift.__all__)
    with pytest.raises(AttributeError):
        p.NoSuchName  # noqa: B018
    probe = ("import sys, kestrel_actors.client\n"
             "assert 'kestrel_actors.protocol.thrift' not in sys.modules, 'loaded at import'\n"
             "from kestrel_actors.protocol import ThriftItem\n"
             "assert 'kestrel_actors.protocol.thrift' in sys.modules\n")
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=120)
