"""The bulk reader of a ``monitor`` reply (``ValueScan``, sans I/O) and its record
(``PackedValues``): whatever way the bytes arrive, the same values in order; a reply out of
step is the same error as with one value at a time. Each test runs twice: with the regular
expression alone (a pure install) and with ``HeaderScan`` taking Kestrel's own blocks (what a
compiled build does; here compiled or not, as the build is)."""

from __future__ import annotations

from array import array

import pytest

from kestrel_actors.client import PackedValues, ServerError, UnexpectedReply, _scan, _wire
from kestrel_actors.client._wire import ValueScan


@pytest.fixture(autouse=True, params=["match", "header-scan"])
def scan_mode(request, monkeypatch):
    monkeypatch.setattr(_wire, "_SCAN_COMPILED", request.param == "header-scan")
    return request.param

VALUES = [b"", b"a", b"END\r\n", b"VALUE q 0 3\r\nxyz\r\nEND\r\n", bytes(range(256)) * 5, b"\r\n"]


def reply(values: list[bytes], key: bytes = b"q") -> bytes:
    return b"".join(b"VALUE %s 0 %d\r\n%s\r\nEND\r\n" % (key, len(v), v) for v in values) + b"END\r\n"


def scan_in_pieces(data: bytes, step: int, limit: int = 100, **options) -> tuple[ValueScan, bytes]:
    """``data`` fed in pieces of ``step`` bytes, as ``recv`` returns them; also the bytes after
    the reply (the next reply's), which the scan must leave to its caller."""
    scan = ValueScan("monitor", b"q", limit, **options)
    for at in range(0, len(data), step):
        piece = data[at:at + step]
        taken = scan.feed(piece)
        if scan.done:
            return scan, piece[taken:] + data[at + step:]
        assert taken == len(piece)
    return scan, b""


@pytest.mark.parametrize("step", [1, 2, 3, 7, 13, 64, 1 << 20])
def test_the_values_come_out_whole_and_in_order_however_the_bytes_are_cut(step):
    scan, left = scan_in_pieces(reply(VALUES) + b"VERSION 1\r\n", step)
    assert scan.done
    packed = scan.values()
    assert packed.count == len(VALUES) and packed.values() == VALUES
    assert bytes(packed.data) == b"".join(VALUES)
    assert left == b"VERSION 1\r\n"  # the next reply is left alone


@pytest.mark.parametrize("step", [100, 300, 1000])
def test_a_header_line_longer_than_one_step_of_a_cut_block_is_made_whole(step):
    """A block cut inside its header line is made whole a step of bytes at a time until its
    length is known: a queue name longer than that step still reads."""
    key = b"k" * 400
    scan = ValueScan("monitor", key, 10)
    data = reply([b"abc", b"x" * 700], key) + b"VERSION 1\r\n"
    for at in range(0, len(data), step):
        piece = data[at:at + step]
        taken = scan.feed(piece)
        if scan.done:
            break
    assert scan.values().values() == [b"abc", b"x" * 700]
    assert piece[taken:] + data[at + step:] == b"VERSION 1\r\n"


def test_an_empty_monitor_is_one_end():
    scan, left = scan_in_pieces(b"END\r\n", 1)
    assert scan.done and scan.values().count == 0 and not left


def test_a_server_error_line_is_mapped_as_for_a_single_value():
    with pytest.raises(ServerError, match="SERVER_ERROR"):
        scan_in_pieces(reply([b"ok"])[:-5] + b"SERVER_ERROR busy\r\n", 5)


@pytest.mark.parametrize("bad, message", [
    (b"VALUE q 0 2\r\nabcEND\r\n", "not followed by CRLF"),
    (b"VALUE q 0 2\r\nab\r\nENX\r\n", "expected END after a value"),
    (b"VALUE other 0 2\r\nab\r\nEND\r\n", "bad VALUE line"),
    (b"VALUE q 0 x2\r\nab\r\nEND\r\n", "bad VALUE line"),
])
def test_a_reply_out_of_step_is_refused(bad, message):
    with pytest.raises(UnexpectedReply, match=message):
        scan_in_pieces(bad + b"END\r\n", 4)


def test_more_values_than_asked_for_is_refused():
    with pytest.raises(UnexpectedReply, match="more than the 2 items"):
        scan_in_pieces(reply([b"a", b"b", b"c"]), 100, limit=2)


def test_flags_other_than_zero_are_read_too():
    scan, _ = scan_in_pieces(b"VALUE q 7 2\r\nhi\r\nEND\r\nEND\r\n", 3)
    assert scan.values().values() == [b"hi"]


def test_packed_values_take_a_run_as_views_of_the_same_bytes():
    values = [bytes([i]) * i for i in range(10)]
    packed = PackedValues.of(values)
    assert packed.take(3, 4).values() == values[3:7]
    assert packed.take(0, 10).values() == values and packed.take(10, 0).count == 0
    assert isinstance(packed.take(3, 4).data, memoryview)


@pytest.mark.parametrize("step", [1, 5, 1 << 20])
def test_a_stamped_stream_keeps_each_enqueue_time_and_a_line_without_one_gets_the_default(step):
    """``monitor ... stamp`` answers ``VALUE q 0 <len> <add_time>``; a server that ignores the
    option (Kestrel) answers without it: 0, which ``stamps_or`` replaces by the read time."""
    data = (b"VALUE q 0 2\r\nab\r\nEND\r\nVALUE q 0 0 1700000000123\r\n\r\nEND\r\n"
            b"VALUE q 0 1 1700000000456\r\nc\r\nEND\r\nEND\r\n")
    scan, _ = scan_in_pieces(data, step, 10, stamped=True)
    packed = scan.values()
    assert scan.done and packed.values() == [b"ab", b"", b"c"]
    stamped = packed.stamps_or(1700000000999)
    assert memoryview(stamped.stamps).cast("q").tolist() == [1700000000999, 1700000000123,
                                                              1700000000456]
    assert memoryview(stamped.take(1, 2).stamps).cast("q").tolist() == [1700000000123,
                                                                         1700000000456]
    with pytest.raises(UnexpectedReply, match="bad VALUE line"):  # not asked for: refused
        scan_in_pieces(b"VALUE q 0 1 1700000000456\r\nc\r\nEND\r\nEND\r\n", 100)


def test_stamps_are_told_zero_only_by_a_whole_zero_stamp():
    """``stamps_or`` looks for a 0 without boxing each stamp: eight zero bytes that straddle
    two stamps are no zero stamp."""
    one_then_high = array("q", [1, 1 << 56]).tobytes()  # 01 00.. 00 | 00.. 00 01: 14 zero bytes
    packed = PackedValues(array("I", [0, 0]).tobytes(), b"", one_then_high)
    assert packed.stamps_or(7) is packed
    zero = PackedValues(array("I", [0, 0, 0]).tobytes(), b"", array("q", [1, 0, 5]).tobytes())
    assert memoryview(zero.stamps_or(7).stamps).cast("q").tolist() == [1, 7, 5]


@pytest.mark.parametrize("step", [3, 64, 1 << 20])
@pytest.mark.parametrize("shape", ["runs", "all-distinct", "one"])
def test_lengths_and_stamps_come_out_one_per_item_whether_they_repeat_or_not(step, shape):
    """The scan keeps lengths and stamps as runs of repeats (a bulk put shares its enqueue
    millisecond; items often share a size), and a stream where nothing repeats (items of
    every size, enqueued slowly) by a pass of its own: either way one per item, in order."""
    if shape == "runs":
        sizes = [3] * 5 + [1] + [0] * 2 + [7] * 4 + [2, 5, 2]
        stamps = [1700000000001] * 6 + [1700000000002] + [1700000000003] * 6 + [4, 4]
    elif shape == "all-distinct":
        sizes = list(range(12))
        stamps = [1700000000000 + 3 * i for i in range(12)]
    else:
        sizes, stamps = [9], [1 << 62]
    values = [bytes([65 + i]) * size for i, size in enumerate(sizes)]
    data = b"".join(b"VALUE q 0 %d %d\r\n%s\r\nEND\r\n" % (len(v), t, v)
                    for v, t in zip(values, stamps, strict=True)) + b"END\r\n"
    scan, _ = scan_in_pieces(data, step, 100, stamped=True)
    packed = scan.values()
    assert scan.done and scan.taken == len(values) and packed.values() == values
    assert memoryview(packed.lengths).cast("I").tolist() == sizes
    assert memoryview(packed.stamps).cast("q").tolist() == stamps


@pytest.mark.parametrize("step", [1, 4, 1 << 20])
def test_odd_headers_between_kestrels_own_come_out_in_order(step):
    """A line the compiled scan leaves to the match (flags other than 0, a value with no stamp,
    a stamp of more digits than 63 bits hold) keeps its place among the others."""
    data = (b"VALUE q 0 1 1700000000001\r\na\r\nEND\r\nVALUE q 7 1\r\nb\r\nEND\r\n"
            b"VALUE q 0 1\r\nc\r\nEND\r\nVALUE q 0 1 1700000000004\r\nd\r\nEND\r\nEND\r\n")
    scan, _ = scan_in_pieces(data, step, 10, stamped=True)
    packed = scan.values()
    assert scan.done and packed.values() == [b"a", b"b", b"c", b"d"]
    assert memoryview(packed.stamps).cast("q").tolist() == [1700000000001, 0, 0, 1700000000004]


@pytest.mark.parametrize("step", [1, 7, 1 << 20])
@pytest.mark.parametrize("room", [0, 5, 4096])
def test_values_written_into_a_reused_buffer_are_exactly_the_reply_s(step, room):
    """``into``: a buffer an earlier reply filled (the planner's pool) is written from its
    start, over its old bytes, and grows only past its size; the values are a view of the
    part written, so the buffer cannot be resized (reused) while they live."""
    data = reply(VALUES)[:-5] + b"VALUE q 7 1\r\nb\r\nEND\r\nEND\r\n"  # a line for the match
    into = bytearray(b"\xee" * room)
    scan, _ = scan_in_pieces(data, step, into=into)
    packed = scan.values()
    assert scan.done and packed.values() == [*VALUES, b"b"]
    assert bytes(packed.data) == b"".join(VALUES) + b"b"
    assert len(into) >= len(packed.data)
    with pytest.raises(BufferError):
        into.append(0)
    del packed
    into.append(0)  # no view left


def test_a_compiled_build_scans_with_the_compiled_header_scan():
    """The planner's per-item step is compiled code when the build is (ADR 0022)."""
    from kestrel_actors import _compiled

    compiled = _compiled.compiled_state() == "mypyc"
    assert _scan.COMPILED is compiled
