"""RESP, Redis's protocol, for the load tests' ``--resp`` mode: a Redis list as the queue.

With ``--resp`` a scenario sends the same requests in Redis's words, so one load generator
drives both servers (``make bench``'s Redis rows): a SET is ``RPUSH <q> <item>`` (reply
``:<length>``), a GET ``LPOP <q>`` (``$<n>`` and the item, or a nil), a blocking GET
``BLPOP <q> <seconds>`` (an array of the key and the item, or a nil array), a flush ``DEL <q>``
and the queue's depth ``LLEN <q>``. Items go in at the tail and come out at the head, so the
list is FIFO and the scenarios' order checks hold as they do for Kestrel's queues.

Requests are built once per client (RESP2, as ``redis-cli`` sends them); replies are scanned
sans I/O by :func:`reply_end`, one whole reply at a time, and classified by :func:`pop_item`
(a pop's reply: the item's whole reply, or None for a nil) and :func:`check_lengths` (pushes'
integer replies), so the lean loop (:mod:`.fleet`) and a greenlet's client check the same
way. Written by hand: a client library's parser owns its socket and buffer, and the hot loop
here needs neither (a reply is usually one ``recv`` and a compare or two).
"""

from __future__ import annotations

from kestrel_actors.client import Connection, UnexpectedReply

__all__ = [
    "NILS",
    "blocking_pop_reply",
    "blocking_pop_request",
    "check_lengths",
    "command",
    "delete_request",
    "length_request",
    "parse_integer",
    "pop_item",
    "pop_reply",
    "pop_request",
    "push_request",
    "read_reply",
    "reply_end",
]

CRLF = b"\r\n"

NILS = frozenset((b"$-1\r\n", b"*-1\r\n", b"_\r\n"))
"""What an empty list's ``LPOP`` (nil bulk) or a timed-out ``BLPOP`` (nil array) answers, in
RESP2, and RESP3's one null."""

_DIGITS_AND_COLONS = b"0123456789:\r\n"


def command(*words: bytes) -> bytes:
    """One request as an array of bulk strings: ``*<n>`` then ``$<len> <word>`` for each."""
    return b"*%d\r\n" % len(words) + b"".join(b"$%d\r\n%s\r\n" % (len(word), word) for word in words)


def push_request(queue: str, data: bytes) -> bytes:
    """``RPUSH <q> <data>``: the SET (at the tail)."""
    return command(b"RPUSH", queue.encode(), data)


def pop_request(queue: str) -> bytes:
    """``LPOP <q>``: the GET (from the head)."""
    return command(b"LPOP", queue.encode())


def blocking_pop_request(queue: str, seconds: int) -> bytes:
    """``BLPOP <q> <seconds>``: the GET that waits (``get <q>/t=…``)."""
    return command(b"BLPOP", queue.encode(), b"%d" % seconds)


def delete_request(queue: str) -> bytes:
    """``DEL <q>``: the flush."""
    return command(b"DEL", queue.encode())


def length_request(queue: str) -> bytes:
    """``LLEN <q>``: the items left in the queue."""
    return command(b"LLEN", queue.encode())


def pop_reply(queue: str, data: bytes) -> bytes:
    """The whole reply of an ``LPOP`` that returns ``data`` (``queue`` unused: the signature of
    ``value_reply``, so a checker takes either)."""
    return b"$%d\r\n%s\r\n" % (len(data), data)


def blocking_pop_reply(queue: str, data: bytes) -> bytes:
    """The whole reply of a ``BLPOP <q>`` that returns ``data``: the key and the item."""
    return b"*2\r\n" + pop_reply(queue, queue.encode()) + pop_reply(queue, data)


def reply_end(buf: bytes | bytearray, at: int = 0) -> int:
    """Where the reply starting at ``at`` in ``buf`` ends (the index after it), or -1 while it
    has not all come. Any RESP2 or RESP3 reply; :class:`UnexpectedReply` for bytes that are none."""
    line_end = buf.find(CRLF, at)
    if line_end < 0:
        if len(buf) - at > 64 and buf[at:at + 1] in (b"$", b"*", b":"):  # no header is that long
            raise UnexpectedReply(f"not a RESP reply: {bytes(buf[at:at + 60])!r}")
        return -1
    kind = buf[at:at + 1]
    if kind in (b"$", b"*", b"=", b"%", b"~", b">"):
        try:
            count = int(buf[at + 1:line_end])
        except ValueError:
            raise UnexpectedReply(f"bad RESP length: {bytes(buf[at:line_end + 2])!r}") from None
        end = line_end + 2
        if count < 0:
            return end
        if kind in (b"$", b"="):
            end += count + 2
            if len(buf) < end:
                return -1
            if buf[end - 2:end] != CRLF:
                raise UnexpectedReply(f"a bulk string of {count} bytes not followed by CRLF")
            return end
        for _ in range(count * 2 if kind == b"%" else count):
            end = reply_end(buf, end)
            if end < 0:
                return -1
        return end
    if kind in (b"+", b"-", b":", b"_", b",", b"#", b"(", b"!"):
        return line_end + 2
    raise UnexpectedReply(f"not a RESP reply: {bytes(buf[at:at + 60])!r}")


def pop_item(reply: bytes) -> bytes | None:
    """A pop's whole reply as the scenarios take it: None for a nil, else the reply itself (a
    hit, which the caller's checker compares byte for byte); :class:`UnexpectedReply` for an
    error (``-WRONGTYPE …``) or anything else that is no item."""
    if reply in NILS:
        return None
    if reply[:1] not in (b"$", b"*"):
        raise UnexpectedReply(f"expected an item or nil, got {reply[:60]!r}")
    return reply


def parse_integer(line: bytes) -> int:
    """The value of an integer reply line (``:5``, without CRLF); UnexpectedReply otherwise."""
    if line[:1] != b":" or not line[1:].isdigit():
        raise UnexpectedReply(f"expected an integer reply, got {line[:60]!r}")
    return int(line[1:])


def check_lengths(replies: bytes | bytearray, count: int) -> bool:
    """Whether ``replies`` holds all ``count`` integer replies of ``count`` pipelined
    ``RPUSH``es (each a list length, ``:<n>``); :class:`UnexpectedReply` for more, or for any
    other reply among them (an error such as ``-WRONGTYPE``, or OOM)."""
    lines = replies.count(CRLF)
    if lines < count:
        if replies[:1] != b":" or replies.translate(None, _DIGITS_AND_COLONS):
            raise UnexpectedReply(f"expected {count} integer replies, got {bytes(replies[:60])!r}")
        return False
    # ``count`` lines, each ``:`` and at least one digit, and nothing else
    if (lines != count or replies[:1] != b":" or replies[-2:] != CRLF or replies.count(b":") != count
            or replies.count(b"\r\n:") != count - 1 or b":\r\n" in replies
            or replies.translate(None, _DIGITS_AND_COLONS)):
        raise UnexpectedReply(f"expected {count} integer replies, got {bytes(replies[:60])!r}")
    return True


def read_reply(conn: Connection) -> bytes:
    """One whole reply from ``conn`` (a greenlet's client): its bytes, as :func:`reply_end` cuts them."""
    line = conn.read_line()
    kind, head = line[:1], line + CRLF
    if kind not in (b"$", b"*"):
        return head
    try:
        count = int(line[1:])
    except ValueError:
        raise UnexpectedReply(f"bad RESP length: {line[:60]!r}") from None
    if count < 0:
        return head
    if kind == b"$":
        body = conn.read_exact(count + 2)
        if body[-2:] != CRLF:
            raise UnexpectedReply(f"a bulk string of {count} bytes not followed by CRLF")
        return head + body
    return head + b"".join(read_reply(conn) for _ in range(count))
