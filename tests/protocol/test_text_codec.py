"""The text protocol codec (behaviour §3, §10 item 15), at the bytes ↔ commands level."""

from __future__ import annotations

import pytest

from kestrel_actors.protocol._commands import Bad
from kestrel_actors.protocol._text import (
    MAX_PUT_BUFFER,
    TEXT_NO_ITEM,
    TEXT_NOT_THAT_MANY,
    TEXT_OP_DELETE,
    TEXT_OP_FLUSH,
    TEXT_OP_GET_ITEM,
    TEXT_OP_MONITOR,
    TEXT_OP_SET_ITEM,
    TEXT_ZERO,
    TextDecoder,
    text_count,
    text_error,
    text_item,
    text_string,
    text_too_many_open,
    text_unavailable,
)
from kestrel_actors.protocol._text_commands import (
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
    text_expiry,
)

DROP = Bad(None, close=True)


def err(message: str) -> Bad:
    return Bad(("-" + message + "\n").encode(), close=False)


def decode(data: bytes) -> list[object]:
    return TextDecoder().feed(data)


# -- behaviour §10 item 15: the transcript ------------------------------------------------------------


def test_put_then_gets_transcript():
    assert decode(b"put q:\nA\nB\n\nget q\nget q\nget q\n") == [
        TextPut("q", None, (b"A", b"B")),
        TextGet("q"),
        TextGet("q"),
        TextGet("q"),
    ]
    # and the replies the connection writes for it: +2, :A, :B, *
    assert text_count(2) + text_item(b"A") + text_item(b"B") + text_item(None) == b"+2\n:A\n:B\n*\n"


def test_peek_and_unknown_command():
    assert decode(b"peek q\nx\n") == [TextGet("q", None, peek=True), err("Unknown command: x")]


# -- framing --------------------------------------------------------------------------------


def test_crlf_and_bare_lf_are_both_line_ends():
    assert decode(b"get a\r\nget b\n") == [TextGet("a"), TextGet("b")]


def test_partial_input_is_buffered_until_the_line_ends():
    decoder = TextDecoder()
    assert decoder.feed(b"ge") == []
    assert decoder.feed(b"t q 50") == []
    assert decoder.feed(b"0\r") == []
    assert decoder.feed(b"\n") == [TextGet("q", 500)]


def test_a_block_can_arrive_in_pieces():
    decoder = TextDecoder()
    assert decoder.feed(b"put q:\nA\n") == []
    assert decoder.feed(b"B\n") == []
    assert decoder.feed(b"\n") == [TextPut("q", None, (b"A", b"B"))]


def test_command_is_lower_cased_but_arguments_keep_their_case():
    assert decode(b"GET Jobs\nPeEk Jobs\n") == [TextGet("Jobs"), TextGet("Jobs", peek=True)]


def test_single_space_split():
    # two spaces: the queue name is the empty token and "q" is the timeout
    assert decode(b"get  q\n") == [err("Error parsing timeout.")]
    assert decode(b"delete  q\n") == [TextDelete("")]
    # trailing spaces are dropped
    assert decode(b"get q   \n") == [TextGet("q")]
    # a leading space makes the command empty
    assert decode(b" get q\n") == [err("Unknown command: ")]
    # tabs are not separators
    assert decode(b"get\tq\n") == [err("Unknown command: get\tq")]


def test_empty_line_is_an_unknown_command():
    assert decode(b"\n") == [err("Unknown command: ")]
    assert decode(b"\r\n") == [err("Unknown command: ")]


def test_a_line_of_spaces_drops_the_connection():
    decoder = TextDecoder()
    assert decoder.feed(b"get q\n   \nget r\n") == [TextGet("q"), DROP]
    assert decoder.closed
    assert decoder.feed(b"get s\n") == []


def test_unknown_command_is_reported_lower_cased_and_ascii():
    assert decode(b"STATS\n") == [err("Unknown command: stats")]
    assert decode(b"\xc9t\xe9\n") == [Bad(b"-Unknown command: ?t?\n", close=False)]
    for command in (b"stats", b"flush_all", b"flush_expired q", b"reload", b"dump_stats", b"set q 0 0 1"):
        [bad] = decode(command + b"\n")
        assert bad == err("Unknown command: " + command.split(b" ")[0].decode())


def test_over_long_line_closes_with_an_error():
    decoder = TextDecoder(max_line_bytes=16)
    assert decoder.feed(b"get q\n" + b"x" * 17) == [TextGet("q"), Bad(b"-Line too long.\n", close=True)]
    assert decoder.closed
    decoder = TextDecoder(max_line_bytes=16)
    assert decoder.feed(b"put q:\n" + b"y" * 20 + b"\n\n") == [Bad(b"-Line too long.\n", close=True)]


def test_line_of_exactly_the_limit_is_fine():
    decoder = TextDecoder(max_line_bytes=8)
    assert decoder.feed(b"get 1234\r\n") == [TextGet("1234")]


# -- put blocks -----------------------------------------------------------------------------


def test_put_with_expiry_in_ms_and_zero():
    assert decode(b"put q 250:\nA\n\nput q 0:\nB\n\nput q -5:\nC\n\n") == [
        TextPut("q", 250, (b"A",)),
        TextPut("q", 0, (b"B",)),
        TextPut("q", -5, (b"C",)),
    ]


def test_text_expiry_is_relative_ms_and_zero_expires_now():
    assert text_expiry(None, 1_000) is None
    assert text_expiry(0, 1_000) == 1_000
    assert text_expiry(250, 1_000) == 1_250
    assert text_expiry(-5, 1_000) == 995
    assert text_expiry(-5_000, 1_000) == 1  # never 0, which means "no expiry"


def test_put_errors():
    assert decode(b"put:\nA\n\n") == [err("Queue name required.")]
    assert decode(b"put q soon:\nA\n\n") == [err("Error parsing expiration time.")]
    assert decode(b"put q 99999999999:\nA\n\n") == [err("Error parsing expiration time.")]


def test_put_without_colon_or_items_has_no_items():
    assert decode(b"put q\n") == [TextPut("q", None, ())]
    assert decode(b"put q:\n\n") == [TextPut("q", None, ())]


def test_items_are_latin1_reencoded_as_utf8():
    assert decode(b"put q:\n\xe9t\xe9\n\x00\x7f\n\n") == [TextPut("q", None, (b"\xc3\xa9t\xc3\xa9", b"\x00\x7f"))]


def test_item_lines_keep_spaces_colons_and_lose_cr():
    assert decode(b"put q:\r\n a b :\r\nc:\r\n\r\n") == [TextPut("q", None, (b" a b :", b"c:"))]


def test_any_command_may_carry_a_block_which_is_ignored():
    assert decode(b"get q:\nignored\nalso\n\nget r\n") == [TextGet("q"), TextGet("r")]
    assert decode(b"version:\nx\n\n") == [TextVersion()]


def test_block_after_spaces_only_line_drops_at_its_end():
    decoder = TextDecoder()
    assert decoder.feed(b"   :\nA\n") == []
    assert decoder.feed(b"\n") == [DROP]


def test_max_put_buffer_swallows_the_next_line():
    items = b"".join(b"%d\n" % i for i in range(MAX_PUT_BUFFER))
    commands = decode(b"put q:\n" + items + b"lost\nget q\n")
    assert len(commands) == 2
    put, get = commands
    assert isinstance(put, TextPut) and len(put.items) == MAX_PUT_BUFFER
    assert put.items[0] == b"0" and put.items[-1] == b"1023"
    assert get == TextGet("q")


def test_max_put_buffer_with_empty_terminator_consumes_only_it():
    items = b"x\n" * MAX_PUT_BUFFER
    commands = decode(b"put q:\n" + items + b"\nget q\n")
    assert [type(c) for c in commands] == [TextPut, TextGet]


def test_1023_items_then_empty_line():
    items = b"x\n" * (MAX_PUT_BUFFER - 1)
    [put, get] = decode(b"put q:\n" + items + b"\nget q\n")
    assert len(put.items) == MAX_PUT_BUFFER - 1 and get == TextGet("q")


# -- get / peek / monitor / confirm -------------------------------------------------------


def test_get_and_peek_timeouts():
    assert decode(b"get q 100\npeek q 5\nget q 0\nget q -3\n") == [
        TextGet("q", 100),
        TextGet("q", 5, peek=True),
        TextGet("q", None),
        TextGet("q", None),
    ]


def test_get_and_peek_errors():
    assert decode(b"get\npeek\nget q soon\npeek q 1.5\n") == [
        err("Queue name required."),
        err("Queue name required."),
        err("Error parsing timeout."),
        err("Error parsing timeout."),
    ]


def test_extra_arguments_are_ignored():
    assert decode(b"get q 10 extra\nflush q x\n") == [TextGet("q", 10), TextFlush("q")]


def test_monitor():
    assert decode(b"monitor q 1000\nmonitor q 0\n") == [TextMonitor("q", 1000), TextMonitor("q", 0)]
    assert decode(b"monitor\nmonitor q\n") == [
        err("Queue name & timeout required."),
        err("Queue name & timeout required."),
    ]


def test_monitor_with_bad_timeout_drops():
    decoder = TextDecoder()
    assert decoder.feed(b"monitor q soon\nget q\n") == [DROP]
    assert decoder.closed


def test_confirm():
    assert decode(b"confirm q 2\n") == [TextConfirm("q", 2)]
    assert decode(b"confirm q\n") == [err("Queue name & count required.")]
    assert decode(b"confirm q x\n") == [DROP]


def test_flush_delete_version_shutdown_quit():
    assert decode(b"flush q\ndelete q\nversion\nshutdown\nquit\n") == [
        TextFlush("q"),
        TextDelete("q"),
        TextVersion(),
        TextShutdown(),
        TextQuit(),
    ]
    assert decode(b"flush\ndelete\n") == [err("Queue name required."), err("Queue name required.")]


def test_status():
    assert decode(b"status\nstatus ReadOnly\nstatus writeavoid\nstatus QUIESCENT\nstatus up\n") == [
        TextStatus(None),
        TextStatus("readonly"),
        TextStatus("writeavoid"),
        TextStatus("quiescent"),
        TextStatus("up"),
    ]
    assert decode(b"status down\nstatus Down\nstatus bogus\n") == [
        err("Status forbidden."),
        err("Status forbidden."),
        err("Unknown status."),
    ]


def test_errors_keep_the_connection_open():
    decoder = TextDecoder()
    commands = decoder.feed(b"bogus\nget\nput q x:\nA\n\nstatus nope\nget q\n")
    assert commands[-1] == TextGet("q")
    assert not decoder.closed
    assert all(not c.close for c in commands if isinstance(c, Bad))


# -- replies --------------------------------------------------------------------------------


def test_reply_encoders():
    assert text_count(0) == TEXT_ZERO == b"+0\n"
    assert text_count(1024) == b"+1024\n"
    assert text_item(b"") == b":\n"
    assert text_item(b"\xc3\xa9") == b":\xc3\xa9\n"
    assert text_item(None) == TEXT_NO_ITEM == b"*\n"
    assert text_string("2.4.7") == b":2.4.7\n"
    assert text_string("READONLY") == b":READONLY\n"
    assert text_error("Unknown command: x") == b"-Unknown command: x\n"
    assert TEXT_NOT_THAT_MANY == b"-Not that many transactions open.\n"
    assert text_too_many_open(0) == b"-Too many open transactions; limit=0\n"


@pytest.mark.parametrize(
    ("op", "reply"),
    [
        (TEXT_OP_SET_ITEM, b"-Server not available for operation setItem\n"),
        (TEXT_OP_GET_ITEM, b"-Server not available for operation getItem\n"),
        (TEXT_OP_MONITOR, b"-Server not available for operation monitorUntil\n"),
        (TEXT_OP_FLUSH, b"-Server not available for operation flush\n"),
        (TEXT_OP_DELETE, b"-Server not available for operation delete\n"),
    ],
)
def test_unavailable_replies(op, reply):
    assert text_unavailable(op) == reply


def test_commands_compare_by_value():
    assert TextPut("q", 1, (b"a",)) == TextPut("q", 1, (b"a",))
    assert TextPut("q", 1, (b"a",)) != TextPut("q", None, (b"a",))
    assert TextGet("q") != TextGet("q", peek=True)
    assert "TextGet(queue='q'" in repr(TextGet("q"))
