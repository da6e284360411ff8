"""STATS and DUMP_STATS over memcache (behaviour §7.3, §10.10): format, key order, exact values."""

from __future__ import annotations

import re
import time

from ..helpers import LONG_WAIT_MS, assert_still_open, expect, fill, stats_of, value, wait_for

GLOBAL_KEYS = [
    "uptime", "time", "version", "curr_items", "total_items", "bytes", "reserved_memory_ratio",
    "curr_connections", "total_connections", "cmd_get", "cmd_set", "cmd_peek", "get_hits",
    "get_misses", "bytes_read", "bytes_written", "queue_creates", "queue_deletes", "queue_expires",
]

QUEUE_STATS = [
    "items", "bytes", "total_items", "logsize", "expired_items", "mem_items", "mem_bytes", "age",
    "discarded", "waiters", "open_transactions", "transactions", "canceled_transactions",
    "total_flushes", "journal_rewrites", "journal_rotations",
]


def raw_reply(client, command: bytes, end: bytes = b"END\r\n") -> bytes:
    """Send ``command`` and return the reply bytes up to and including the final ``END``."""
    client.send(command + b"\r\n")
    while not client.buffer.endswith(end):
        if not client._fill():
            raise AssertionError(f"closed; buffered {client.buffer!r}")
    data, client.buffer = client.buffer, b""
    return data


def stat_lines(client) -> list[tuple[str, str]]:
    data = raw_reply(client, b"stats")
    assert data.endswith(b"\r\nEND\r\n")
    pairs = []
    for line in data[: -len(b"\r\nEND\r\n")].split(b"\r\n"):
        match = re.fullmatch(rb"STAT (\S+) (.*)", line, re.S)
        assert match, line
        pairs.append((match.group(1).decode("latin-1"), match.group(2).decode("latin-1")))
    return pairs


def test_stats_format_and_global_key_order(server):
    c = server.client()
    data = raw_reply(c, b"stats")
    assert re.fullmatch(rb"(STAT [a-z_]+ [^\r\n]*\r\n)+END\r\n", data), data
    pairs = stat_lines(c)
    assert [k for k, _ in pairs] == GLOBAL_KEYS  # no queue yet
    stats = dict(pairs)
    for key in GLOBAL_KEYS:
        if key not in ("version", "reserved_memory_ratio"):
            assert re.fullmatch(r"\d+", stats[key]), (key, stats[key])
    assert re.fullmatch(r"\d+\.\d{3}", stats["reserved_memory_ratio"])
    assert abs(int(stats["time"]) - time.time()) < 5
    assert int(stats["uptime"]) < 60
    c.send(b"version\r\n")
    assert c.read_line() == b"VERSION " + stats["version"].encode()


def test_stats_arguments_are_ignored(server):
    c = server.client()
    assert [k for k, _ in stat_lines(c)] == GLOBAL_KEYS
    data = raw_reply(c, b"stats items detail")
    assert [line.split(b" ")[1].decode() for line in data.split(b"\r\n")[:-2]] == GLOBAL_KEYS


def test_per_queue_keys_are_contiguous_and_in_order(server):
    c = server.client()
    names = ["alpha", "beta", "gamma_x", "d"]
    for name in names:
        fill(c, name, b"x")
    keys = [k for k, _ in stat_lines(c)]
    assert keys[:19] == GLOBAL_KEYS
    queue_keys = keys[19:]
    # Kestrel's 16, in its order, then ours: oldest_item_age, journal_failing
    assert len(queue_keys) == 18 * len(names)
    blocks = [queue_keys[i : i + 18] for i in range(0, len(queue_keys), 18)]
    seen = []
    for block in blocks:
        name = next(n for n in names if block[0] == f"queue_{n}_items")
        assert block == [f"queue_{name}_{stat}" for stat in [*QUEUE_STATS, "oldest_item_age", "journal_failing"]]
        seen.append(name)
    assert sorted(seen) == sorted(names)


def test_exact_counter_values(server):
    c = server.client()
    # c alone (the start-up probes' hang-ups counted), asked on c itself: a client opened to
    # ask could still be counted when the figures below are read
    assert wait_for(lambda: dict(stat_lines(c))["curr_connections"] == "1")
    fill(c, "a", b"hello", b"hi")
    fill(c, "b", b"xyz")
    c.send(b"get a\r\n")  # hit
    expect(c, value("a", b"hello"))
    c.send(b"get b/peek\r\n")  # peek hit
    expect(c, value("b", b"xyz"))
    c.send(b"get b/open\r\n")  # hit, opened
    expect(c, value("b", b"xyz"))
    c.send(b"get c\r\n")  # miss, creates c
    expect(c, b"END\r\n")
    c.send(b"get a/close\r\nget a/abort\r\n")  # no fetch: counted nowhere
    expect(c, b"END\r\nEND\r\n")
    c.send(b"get c/peek\r\n")  # peek miss
    expect(c, b"END\r\n")
    c.send(b"get c/t=50\r\n")  # timed-out miss
    expect(c, b"END\r\n")
    stats = dict(stat_lines(c))
    expected = {
        "curr_items": "1", "total_items": "3", "bytes": "2", "curr_connections": "1",
        "cmd_get": "4", "cmd_set": "3", "cmd_peek": "2", "get_hits": "3", "get_misses": "3",
        "queue_creates": "3", "queue_deletes": "0", "queue_expires": "0",
        "queue_a_items": "1", "queue_a_bytes": "2", "queue_a_total_items": "2",
        "queue_a_open_transactions": "0", "queue_a_waiters": "0",
        "queue_b_items": "0", "queue_b_bytes": "0", "queue_b_total_items": "1",
        "queue_b_open_transactions": "1", "queue_b_waiters": "0",
        "queue_c_items": "0", "queue_c_bytes": "0", "queue_c_total_items": "0",
        "queue_c_open_transactions": "0", "queue_c_total_flushes": "0",
    }
    assert {k: stats.get(k) for k in expected} == expected


def test_curr_and_total_connections_follow_clients(server):
    c = server.client()
    assert wait_for(lambda: dict(stat_lines(c))["curr_connections"] == "1")
    total = int(dict(stat_lines(c))["total_connections"])
    others = [server.client() for _ in range(3)]
    for o in others:
        assert_still_open(o)
    stats = dict(stat_lines(c))
    assert (stats["curr_connections"], stats["total_connections"]) == ("4", str(total + 3))
    for o in others:
        o.close()
    assert wait_for(lambda: dict(stat_lines(c))["curr_connections"] == "1")
    assert dict(stat_lines(c))["total_connections"] == str(total + 3)


def test_bytes_read_and_written_count_every_protocol_byte(server):
    c = server.client()
    first = raw_reply(c, b"stats")
    before = dict(stat_lines_from(first))
    set_request = b"set q 0 0 5\r\nhello\r\n"
    c.send(set_request)
    expect(c, b"STORED\r\n")
    after = dict(stat_lines(c))
    assert int(after["bytes_read"]) - int(before["bytes_read"]) == len(set_request) + len(b"stats\r\n")
    assert int(after["bytes_written"]) - int(before["bytes_written"]) == len(first) + len(b"STORED\r\n")


def stat_lines_from(data: bytes) -> list[tuple[str, str]]:
    return [tuple(line.decode("latin-1").split(" ", 2)[1:]) for line in data.split(b"\r\n")[:-2]]


def test_open_abort_close_move_items_and_open_transactions(server):
    c = server.client()
    fill(c, "q", b"aaa", b"bb")

    def q():
        s = dict(stat_lines(c))
        return tuple(s[f"queue_q_{k}"] for k in ("items", "bytes", "open_transactions", "canceled_transactions"))

    assert q() == ("2", "5", "0", "0")
    c.send(b"get q/open\r\n")
    expect(c, value("q", b"aaa"))
    assert q() == ("1", "2", "1", "0")
    c.send(b"get q/abort\r\n")
    expect(c, b"END\r\n")
    assert q() == ("2", "5", "0", "1")
    c.send(b"get q/open\r\nget q/close\r\n")
    expect(c, value("q", b"aaa") + b"END\r\n")
    assert q() == ("1", "2", "0", "1")
    c.send(b"get q/open\r\n")
    expect(c, value("q", b"bb"))
    c.close()
    d = server.client()
    assert wait_for(lambda: dict(stat_lines(d))["queue_q_open_transactions"] == "0")
    stats = dict(stat_lines(d))
    assert (stats["queue_q_items"], stats["queue_q_canceled_transactions"]) == ("1", "2")


def test_total_items_counts_adds_not_length(server):
    c = server.client()
    fill(c, "q", b"1", b"2", b"3")
    c.send(b"get q\r\nget q\r\n")
    expect(c, value("q", b"1") + value("q", b"2"))
    stats = dict(stat_lines(c))
    assert (stats["total_items"], stats["queue_q_total_items"], stats["curr_items"]) == ("3", "3", "1")


def test_flush_and_delete_counters(server):
    c = server.client()
    fill(c, "q", b"1", b"2")
    fill(c, "r", b"3")
    c.send(b"flush q\r\nflush q\r\n")
    expect(c, b"END\r\nEND\r\n")
    stats = dict(stat_lines(c))
    assert (stats["queue_q_items"], stats["queue_q_total_flushes"], stats["curr_items"]) == ("0", "2", "1")
    c.send(b"delete r\r\ndelete nosuch\r\n")
    expect(c, b"DELETED\r\nDELETED\r\n")
    stats = dict(stat_lines(c))
    assert stats["queue_deletes"] == "1"
    assert stats["queue_creates"] == "2"
    assert not any(k.startswith(("queue_r_", "queue_nosuch_")) for k in stats)
    assert stats["curr_items"] == "0"


def test_age_stat(server):
    c = server.client()
    before_old = time.monotonic()
    fill(c, "q", b"old")
    never_read = int(dict(stat_lines(c))["queue_q_age"])
    assert abs(never_read - time.time() * 1000) < 60_000  # now - epoch before the first removal
    time.sleep(0.3)
    fill(c, "q", b"new")
    c.send(b"get q\r\n")
    expect(c, value("q", b"old"))
    age = int(dict(stat_lines(c))["queue_q_age"])
    # now - addTime of "old" (at most the time since just before its SET); "new" keeps bytes non-zero
    assert 250 <= age <= (time.monotonic() - before_old) * 1000 + 5
    c.send(b"get q\r\n")
    expect(c, value("q", b"new"))
    assert dict(stat_lines(c))["queue_q_age"] == "0"  # byte count is 0


def test_waiters_stat_counts_blocked_readers(server):
    c = server.client()
    blocked = [server.client() for _ in range(2)]
    for b in blocked:
        b.send(b"get q/t=%d\r\n" % LONG_WAIT_MS)
    assert wait_for(lambda: dict(stat_lines(c)).get("queue_q_waiters") == "2")
    blocked[0].close()
    assert wait_for(lambda: dict(stat_lines(c)).get("queue_q_waiters") == "1")


def test_monitor_fetches_count_as_hits(make_server):
    server = make_server("--max-open-transactions", "10")
    c = server.client()
    fill(c, "q", b"1", b"2")
    before = dict(stat_lines(c))
    c.send(b"monitor q 1 2\r\n")
    expect(c, value("q", b"1") + value("q", b"2") + b"END\r\n")
    after = dict(stat_lines(c))
    assert int(after["get_hits"]) - int(before["get_hits"]) == 2
    assert after["queue_q_open_transactions"] == "2"


# -- DUMP_STATS -----------------------------------------------------------------------------


def test_dump_stats_with_no_queues_is_a_blank_line_then_end(server):
    c = server.client()
    assert raw_reply(c, b"dump_stats") == b"\r\nEND\r\n"


def test_dump_stats_of_a_missing_name(server):
    c = server.client()
    assert raw_reply(c, b"dump_stats nosuch") == b"queue 'nosuch' {\r\n  \r\n}\r\nEND\r\n"
    assert not any(k.startswith("queue_nosuch_") for k in stats_of(server))


def _dump_block(name: str, stats: dict[str, str]) -> bytes:
    keys = [*QUEUE_STATS, "oldest_item_age", "journal_failing"]
    lines = [f"queue '{name}' {{", *[f"  {k}={stats[f'queue_{name}_{k}']}" for k in keys], "}"]
    return "\r\n".join(lines).encode()


def test_dump_stats_block_format(server):
    c = server.client()
    fill(c, "q", b"hello")
    data = raw_reply(c, b"dump_stats q")
    lines = data.split(b"\r\n")
    assert lines[0] == b"queue 'q' {"
    assert [line.split(b"=")[0] for line in lines[1:17]] == [b"  " + k.encode() for k in QUEUE_STATS]
    assert lines[17].startswith(b"  oldest_item_age=")  # ours, after Kestrel's 16
    assert lines[18] == b"  journal_failing=0"
    assert lines[19:] == [b"}", b"END", b""]
    stats = dict(stat_lines(c))
    dumped = {line[2:].split(b"=")[0].decode(): line.split(b"=", 1)[1].decode() for line in lines[1:17]}
    for k in QUEUE_STATS:
        if k != "age":
            assert dumped[k] == stats[f"queue_q_{k}"], k
    assert (dumped["items"], dumped["bytes"], dumped["total_items"]) == ("1", "5", "1")


def test_dump_stats_of_several_names_and_of_all(server):
    c = server.client()
    fill(c, "one", b"1")
    fill(c, "two", b"22")
    c.send(b"get one\r\n")
    expect(c, value("one", b"1"))
    stats = dict(stat_lines(c))

    def strip_age(data: bytes) -> bytes:  # both ages move with the clock
        return re.sub(rb"  (age|oldest_item_age)=\d+", rb"  \1=", data)

    def block(name):
        s = dict(stats, **{f"queue_{name}_age": "", f"queue_{name}_oldest_item_age": ""})
        return _dump_block(name, s)

    named = raw_reply(c, b"dump_stats two nosuch one")
    assert strip_age(named) == (
        block("two") + b"\r\nqueue 'nosuch' {\r\n  \r\n}\r\n" + block("one") + b"\r\nEND\r\n"
    )
    everything = strip_age(raw_reply(c, b"dump_stats"))
    assert everything in (
        block("one") + b"\r\n" + block("two") + b"\r\nEND\r\n",
        block("two") + b"\r\n" + block("one") + b"\r\nEND\r\n",
    )
