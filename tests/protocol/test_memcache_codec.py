"""The sans-I/O memcache codec: framing, limits and every command's parse (behaviour §2)."""

from __future__ import annotations

import pytest

from kestrel_actors import protocol as p
from kestrel_actors.protocol import MemcacheDecoder, ValueReplies, parse_get_key, value_reply
from kestrel_actors.queue_name import name_bytes

DROP = p.Bad(None, close=True)
CLIENT_ERROR_CLOSE = p.Bad(p.CLIENT_ERROR, close=True)
CLIENT_ERROR_OPEN = p.Bad(p.CLIENT_ERROR, close=False)


def decode(data: bytes, **limits) -> list[object]:
    return MemcacheDecoder(**limits).feed(data)


def test_set_with_crlf_and_bare_lf_and_unchecked_terminator():
    assert decode(b"set q 0 0 5\r\nhello\r\n") == [p.Set("q", 0, b"hello")]
    assert decode(b"set q 0 0 5\nhello\r\n") == [p.Set("q", 0, b"hello")]
    assert decode(b"set q 0 0 5\r\nhello!!") == [p.Set("q", 0, b"hello")]


def test_an_answered_set_given_back_is_refilled_as_the_next_set_and_a_get_never_is():
    decoder = MemcacheDecoder()
    first, get = decoder.feed(b"set q 0 0 5\r\nhello\r\nget q\r\n")
    decoder.reuse(get)  # a line's Get is shared by its repeats: never refilled
    decoder.reuse(first)
    assert first.data == b""  # its item's bytes go as it is given back
    again, second, get_again = decoder.feed(b"set r 7 0 2\r\nhi\r\nset q 0 0 3\r\nabc\r\nget q\r\n")
    assert again is first and again == p.Set("r", 0, b"hi")
    assert second is not first and second == p.Set("q", 0, b"abc")
    assert get_again is get and get == p.Get("q")


def test_binary_data_block_may_hold_crlf_and_nul():
    data = b"a\r\nb\x00c\r\n"
    assert decode(b"set q 7 0 %d\r\n%s\r\n" % (len(data), data)) == [p.Set("q", 0, data)]


def test_input_split_at_every_byte_gives_the_same_commands():
    stream = b"set q 0 0 5\r\nhello\r\nget q/t=10/open\r\nstats\r\n"
    expected = decode(stream)
    for cut in range(len(stream)):
        decoder = MemcacheDecoder()
        assert decoder.feed(stream[:cut]) + decoder.feed(stream[cut:]) == expected


@pytest.mark.parametrize("kind", [bytes, bytearray])
def test_an_items_data_is_bytes_whatever_the_read_was(kind):
    # a read parsed in place hands out its own slices; one kept in the decoder's bytearray
    # must not hand out bytearray slices (an item is stored, journaled and replied as bytes)
    stream = b"set q 0 0 5\r\nhello\r\nset q 0 0 3\r\nabc\r\n"
    decoder = MemcacheDecoder()
    commands = decoder.feed(kind(stream[:20])) + decoder.feed(kind(stream[20:]))
    assert commands == [p.Set("q", 0, b"hello"), p.Set("q", 0, b"abc")]
    assert [type(command.data) for command in commands] == [bytes, bytes]


def test_pipelined_requests_come_out_in_order():
    commands = decode(b"set a 0 0 1\r\nx\r\nget a\r\nversion\r\ndelete a\r\n")
    assert [type(c) for c in commands] == [p.Set, p.Get, p.Version, p.Delete]


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("q", p.Get("q")),
        ("q/t=500", p.Get("q", timeout_ms=500)),
        ("q/open/t=5", p.Get("q", 5, open=True)),
        ("q/close/open", p.Get("q", open=True, close=True)),
        ("q/open/close", p.Get("q", open=True, close=True)),
        ("q/peek", p.Get("q", peek=True)),
        ("q/abort", p.Get("q", abort=True)),
        ("q/t=0", p.Get("q")),
        ("q/t=-5", p.Get("q")),
        ("q/t=1/t=2", p.Get("q", 2)),
        ("q/foo//OPEN", p.Get("q")),
        ("q/", p.Get("q")),
        ("q/open/open", p.Get("q", open=True)),
    ],
)
def test_get_options(key, expected):
    assert parse_get_key(key) == expected


@pytest.mark.parametrize(
    "key", ["/open", "", "q/open/peek", "q/close/peek", "q/open/abort", "q/close/abort", "q/peek/abort"]
)
def test_illegal_get_keys_get_client_error_and_close(key):
    assert parse_get_key(key) == CLIENT_ERROR_CLOSE


@pytest.mark.parametrize("key", ["q/t=", "q/t=x", "q/t=1.5", "q/t=99999999999"])
def test_bad_timeout_drops_the_connection(key):
    assert parse_get_key(key) == DROP


def test_get_uses_only_the_first_key_and_two_spaces_mean_an_empty_key():
    assert decode(b"get a b\r\n") == [p.Get("a")]
    assert decode(b"gets a\r\n") == [p.Get("a")]
    assert decode(b"get  q\r\n") == [CLIENT_ERROR_CLOSE]
    assert decode(b"get\r\n") == [CLIENT_ERROR_OPEN]
    assert decode(b"GET q   \r\n") == [p.Get("q")]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b"set q 0 0\r\n", DROP),
        (b"set q 0 0 x\r\n", DROP),
        (b"set q 0 0 -1\r\n", DROP),
        (b"set q 0 x 1\r\nz\r\n", DROP),
        (b"set q x 0 1\r\nz\r\n", CLIENT_ERROR_OPEN),
        (b"set q 4294967296 0 1\r\nz\r\n", CLIENT_ERROR_OPEN),
        (b"add q 0 0 1\r\nz\r\n", CLIENT_ERROR_CLOSE),
        (b"cas q 0 0 1 5\r\nz\r\n", CLIENT_ERROR_CLOSE),
        (b"incr q 1\r\n", CLIENT_ERROR_CLOSE),
        (b"\r\n", CLIENT_ERROR_CLOSE),
        (b" get q\r\n", CLIENT_ERROR_CLOSE),
        (b"set q 0 0 5 noreply\r\nhello\r\n", p.Set("q", 0, b"hello")),
        (b"set q 0 -1 0\r\n\r\n", p.Set("q", -1, b"")),
    ],
)
def test_storage_lines(line, expected):
    assert decode(line) == [expected]


def test_flags_error_keeps_the_stream_in_sync():
    commands = decode(b"set q x 0 1\r\nz\r\nget q\r\n")
    assert commands == [CLIENT_ERROR_OPEN, p.Get("q")]


def test_a_closing_error_ends_the_stream_and_later_bytes_are_ignored():
    decoder = MemcacheDecoder()
    assert decoder.feed(b"version\r\nincr q\r\nversion\r\n") == [p.Version(), CLIENT_ERROR_CLOSE]
    assert decoder.closed
    assert decoder.feed(b"version\r\n") == []


def test_declared_length_over_the_cap_is_refused_before_any_data_arrives():
    decoder = MemcacheDecoder(max_item_bytes=1024)
    assert decoder.feed(b"set q 0 0 1025\r\n") == [CLIENT_ERROR_CLOSE]
    assert decode(b"set q 0 0 2000000000\r\n") == [CLIENT_ERROR_CLOSE]


def test_a_line_parsed_before_is_checked_against_each_decoders_own_limit():
    # get and set lines are parsed once and remembered; the item cap is per decoder
    assert decode(b"set capped 0 0 1025\r\n" + b"x" * 1025 + b"\r\n")[0].data == b"x" * 1025
    assert decode(b"set capped 0 0 1025\r\n", max_item_bytes=1024) == [CLIENT_ERROR_CLOSE]


def test_repeated_lines_parse_alike_and_errors_are_not_remembered():
    stream = b"set q x 0 1\r\nz\r\nset q 0 9 1\r\ny\r\nget q/t=5/open\r\nget q/abort/peek\r\n"
    expected = [CLIENT_ERROR_OPEN, p.Set("q", 9, b"y"), p.Get("q", 5, open=True), CLIENT_ERROR_CLOSE]
    assert decode(stream) == expected
    assert decode(stream) == expected
    assert decode(b"set q 0 9 1\r\nw\r\n") == [p.Set("q", 9, b"w")]


def test_a_connections_repeated_lines_parse_as_they_did_the_first_time():
    # one decoder keeps its last set and get lines: every way a repeat can arrive (whole, at the
    # start of a read or behind another request, split, after leftovers, its end changed, a
    # line like it but longer or shorter) parses as a fresh decoder parses it
    stream = (b"set q 0 0 3\r\nabc\r\nget q\r\nset q 0 0 3\r\ndef\r\nget q\r\n"
              b"set q 0 0 3\nghi\r\nget q/t=5\r\nget q\nset q 0 0 33\r\n" + b"j" * 33 + b"\r\n"
              b"set q 0 0 3\r\nklm\r\nget qq\r\nget q\r\nset q2 0 0 3\r\nnop\r\nget q\r\n")
    expected = decode(stream)
    assert [type(command) for command in expected] == [p.Set, p.Get] * 2 + [p.Set, p.Get, p.Get, p.Set] + [
        p.Set, p.Get, p.Get, p.Set, p.Get]
    for size in (1, 2, 3, 5, 7, 11, 16, 23, 64, len(stream)):
        decoder = MemcacheDecoder()
        got: list[object] = []
        for start in range(0, len(stream), size):
            got += decoder.feed(stream[start:start + size])
        assert got == expected, size
        decoder = MemcacheDecoder()
        got = []
        for start in range(0, len(stream), size):
            got += decoder.feed(bytearray(stream[start:start + size]))
        assert got == expected, size


def test_a_burst_of_one_get_line_parses_as_each_line_would_however_it_is_cut():
    # a burst of a connection's last get line is known several lines at a time: any count of
    # them, cut anywhere, with other lines among and after them, parses line by line alike
    stream = (b"get q\r\n" * 21 + b"get q/peek\r\n" + b"get q\r\n" * 9 + b"get q\n" + b"get q\r\n" * 8
              + b"get qq\r\n" + b"get q\r\n" * 17 + b"version\r\n")
    expected = ([p.Get("q")] * 21 + [p.Get("q", peek=True)] + [p.Get("q")] * 18 + [p.Get("qq")] + [p.Get("q")] * 17
                + [p.Version()])
    assert decode(stream) == expected
    for size in (1, 3, 7, 8, 13, 56, 57, 100, len(stream)):
        for kind in (bytes, bytearray):
            decoder = MemcacheDecoder()
            got: list[object] = []
            for start in range(0, len(stream), size):
                got += decoder.feed(kind(stream[start:start + size]))
            assert got == expected, (size, kind)


def test_a_repeated_line_is_held_to_the_limits_and_errors_of_a_new_one():
    decoder = MemcacheDecoder(max_item_bytes=4)
    assert decoder.feed(b"set q 0 0 4\r\nabcd\r\nset q 0 0 4\r\nefgh\r\n") == [
        p.Set("q", 0, b"abcd"), p.Set("q", 0, b"efgh")]
    assert decoder.feed(b"set q 0 0 5\r\n") == [CLIENT_ERROR_CLOSE]
    decoder = MemcacheDecoder()
    assert decoder.feed(b"get q\r\nget q/abort/peek\r\nget q\r\n") == [p.Get("q"), CLIENT_ERROR_CLOSE]
    decoder = MemcacheDecoder()
    assert decoder.feed(b"set q 0 0 1\r\na\r\nset q 0 0 1") == [p.Set("q", 0, b"a")]  # a repeat cut short
    assert decoder.feed(b"\r\nb\r\n") == [p.Set("q", 0, b"b")]
    long_name = "q" * 300  # a line too long to be kept is parsed afresh each time, alike
    line = f"get {long_name}\r\n".encode()
    assert MemcacheDecoder().feed(line * 3) == [p.Get(long_name)] * 3


def test_overlong_line_is_refused_without_waiting_for_its_end():
    decoder = MemcacheDecoder(max_line_bytes=100)
    assert decoder.feed(b"get " + b"q" * 50) == []
    assert decoder.feed(b"q" * 60) == [CLIENT_ERROR_CLOSE]
    assert decode(b"get " + b"q" * 200 + b"\r\n", max_line_bytes=100) == [CLIENT_ERROR_CLOSE]


def test_a_short_data_block_waits_for_more():
    decoder = MemcacheDecoder()
    assert decoder.feed(b"set q 0 0 10\r\nabc") == []
    assert decoder.feed(b"defghij\r\n") == [p.Set("q", 0, b"abcdefghij")]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b"monitor q 5 10", p.Monitor("q", 5, 10)),
        (b"monitor q 5", p.Monitor("q", 5, None)),
        (b"monitor q", DROP),
        (b"monitor", CLIENT_ERROR_OPEN),
        (b"monitor q x", DROP),
        (b"confirm q 3", p.Confirm("q", 3)),
        (b"confirm q", CLIENT_ERROR_OPEN),
        (b"confirm q x", DROP),
        (b"delete q", p.Delete("q")),
        (b"delete", CLIENT_ERROR_OPEN),
        (b"flush q", p.Flush("q")),
        (b"flush", CLIENT_ERROR_OPEN),
        (b"flush_all", p.FlushAll()),
        (b"flush_expired q", p.FlushExpired("q")),
        (b"flush_expired", DROP),
        (b"flush_all_expired", p.FlushAllExpired()),
        (b"stats extra", p.Stats()),
        (b"dump_stats a b", p.DumpStats(("a", "b"))),
        (b"version", p.Version()),
        (b"shutdown", p.Shutdown()),
        (b"reload", p.Reload()),
        (b"quit", p.Quit()),
        (b"status", p.Status(None)),
        (b"status ReadOnly", p.Status("readonly")),
        (b"status down", CLIENT_ERROR_CLOSE),
        (b"status bogus", CLIENT_ERROR_CLOSE),
    ],
)
def test_other_commands(line, expected):
    assert decode(line + b"\r\n") == [expected]


def test_names_keep_their_case_and_bytes():
    """A name is its bytes: UTF-8 is read as text, any other byte survives the round trip."""
    assert decode("get Qé/t=5\r\n".encode()) == [p.Get("Qé", 5)]
    [latin1] = decode(b"get Q\xe9\r\n")
    assert latin1.queue != "Q\xe9" and name_bytes(latin1.queue) == b"Q\xe9"
    assert value_reply(latin1.queue, b"x").startswith(b"VALUE Q\xe9 0 1\r\n")
    assert value_reply("jobs+漢", b"x").startswith("VALUE jobs+漢 0 1\r\n".encode())


def test_value_reply_bytes():
    assert value_reply("work", b"hello") == b"VALUE work 0 5\r\nhello\r\nEND\r\n"
    assert value_reply("q", b"") == b"VALUE q 0 0\r\n\r\nEND\r\n"


def test_a_connections_value_replies_are_value_reply_whatever_came_before():
    replies = ValueReplies()
    latin1 = p.parse_request_line([b"get", b"Q\xe9"]).queue
    for queue, data in [("work", b"hello"), ("work", b"world"), ("work", b"hello!"), ("q", b"hello!"), ("q", b""),
                        ("jobs+\u6f22", b"x"), (latin1, b"x"), ("work", b"x" * 1024), ("work", b"y" * 1024)]:
        assert replies.reply(queue, data) == value_reply(queue, data)


def test_a_bursts_hits_are_each_hits_reply_and_a_miss_is_end():
    replies = ValueReplies()
    for queue, datas in [("work", [b"a" * 1024, b"b" * 1024, None, b"c" * 1024]),
                         ("q", [b"dd", b"e", b"", b"ff", None, None]), ("work", [b"g" * 1024]), ("q", [])]:
        out: list[bytes] = []
        replies.add_hits(out, queue, datas)
        assert b"".join(out) == b"".join(p.END if data is None else value_reply(queue, data) for data in datas)


def test_a_bursts_hits_in_a_row_are_two_parts_each_and_one_end():
    """n hits in a row are 2n + 1 parts (a hit's ``END`` and the next ``VALUE`` line one part),
    a miss between them ends the row: fewer parts for the flush to count and join."""
    replies = ValueReplies()
    hits = [b"a" * 1024] * 31 + [b"b" * 1000]
    out: list[bytes] = []
    replies.add_hits(out, "work", hits)
    assert len(out) == 2 * len(hits) + 1
    out = []
    replies.add_hits(out, "work", [*hits[:3], None, *hits[:2]])
    assert len(out) == (2 * 3 + 1) + 1 + (2 * 2 + 1)
    assert b"".join(out) == b"".join([*(value_reply("work", d) for d in hits[:3]), p.END,
                                      *(value_reply("work", d) for d in hits[:2])])


def test_a_monitor_streams_parts_are_its_replies_each_end_joined_to_the_next_line():
    """A monitor stream of n replies goes out as 2n + 1 parts (``END`` and the next ``VALUE``
    line as one), and they are the n replies' bytes whatever the sizes, times and queues."""
    replies = ValueReplies()
    stream = [("work", b"a" * 1024, 1), ("work", b"b" * 1024, 1), ("work", b"c" * 1024, 2), ("work", b"", 2),
              ("q", b"d", 2), ("q", b"d", 2), ("work", b"e" * 1024, 1)]
    for stamped in (True, False):
        out: list[bytes] = []
        follows = False
        for queue, data, add_time in stream:
            replies.add_stream_parts(out, queue, data, add_time, stamped, follows)
            follows = True
        replies.end_stream(out)
        assert len(out) == 2 * len(stream) + 1
        expected = [replies.stamped(q, d, t) if stamped else value_reply(q, d) for q, d, t in stream]
        assert b"".join(out) == b"".join(expected)
