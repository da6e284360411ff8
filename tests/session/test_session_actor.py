"""The session in process: a real ``SessionActor`` and protocol handler, a real queue collection
with memory journals, and a buffer standing in for the socket transport.

What goes in is what a transport hands over (``Received`` of decoded commands, then
``Disconnected``), through the dispatcher as on the server; what comes out is the exact
bytes the session gave its transport.
"""

from __future__ import annotations

import gevent
import structlog.testing

from kestrel_actors.config import QueueConfig
from kestrel_actors.protocol import MemcacheDecoder
from kestrel_actors.runtime import Dispatcher
from kestrel_actors.session import MemcacheHandler, Received, Reload, Shutdown, TextHandler
from kestrel_actors.status import Status

from ..helpers import LONG_WAIT_MS, BufferTransport, World, settle


def test_set_then_get_exact_bytes(world):
    client = world.connect()
    assert client.send(b"set jobs 0 0 5\r\nhello\r\n") == b"STORED\r\n"
    assert client.send(b"get jobs\r\n") == b"VALUE jobs 0 5\r\nhello\r\nEND\r\n"
    assert client.send(b"get jobs\r\n") == b"END\r\n"
    assert (world.stats.cmd_set, world.stats.cmd_get, world.stats.get_hits) == (1, 2, 1)


class PartsTransport(BufferTransport):
    """A buffer that also keeps what the session handed over as parts, unjoined."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[list[bytes]] = []

    def send_parts(self, parts: list[bytes], size: int) -> None:
        self.parts.append(list(parts))
        super().send_parts(parts, size)


def test_a_hit_reaches_the_transport_as_its_parts_the_data_not_joined(world):
    # the item's data is handed over as it is, not copied into a joined reply first (ADR 0021)
    transport = PartsTransport()
    client = world.connect(transport=transport)
    data = bytes(range(256)) * 400
    assert client.send(b"set big 0 0 102400\r\n" + data + b"\r\n") == b"STORED\r\n"
    assert client.send(b"get big\r\n") == b"VALUE big 0 102400\r\n" + data + b"\r\nEND\r\n"
    assert transport.parts == [[b"VALUE big 0 102400\r\n", data, b"\r\nEND\r\n"]]
    assert client.send(b"set big 0 0 5\r\nhello\r\nget big/t=10\r\nget big\r\n") == (
        b"STORED\r\nVALUE big 0 5\r\nhello\r\nEND\r\nEND\r\n")


class DecodingTransport(BufferTransport):
    """A buffer that gives answered requests back to its client's decoder, as the socket
    transport does (``SocketTransport.reuse``), and keeps them."""

    def __init__(self) -> None:
        super().__init__()
        self.decoder = MemcacheDecoder()
        self.given_back: list[object] = []

    def reuse(self, command) -> None:
        self.given_back.append(command)
        self.decoder.reuse(command)


def test_an_answered_set_is_its_connections_next_refilled_and_every_item_keeps_its_bytes(world):
    # two connections interleaved, each with its own decoder: a lone SET's command, answered, is
    # refilled as that connection's next SET (never the other's), a pipelined pair is not given
    # back (nor refilled while in flight), and every item reads back as it was sent
    one, two = DecodingTransport(), DecodingTransport()
    a, b = world.connect(transport=one), world.connect(transport=two)
    a.decoder, b.decoder = one.decoder, two.decoder
    assert a.send(b"set q 0 0 2\r\na1\r\n") == b"STORED\r\n"
    assert b.send(b"set q 0 0 2\r\nb1\r\n") == b"STORED\r\n"
    (first,), (other,) = one.given_back, two.given_back
    assert first is not other and first.data == other.data == b""
    assert a.send(b"set r 0 0 2\r\na2\r\n") == b"STORED\r\n"
    assert one.given_back == [first, first]
    assert a.send(b"set q 0 0 2\r\na3\r\nset q 0 0 2\r\na4\r\n") == b"STORED\r\nSTORED\r\n"
    assert b.send(b"set q 0 0 2\r\nb2\r\n") == b"STORED\r\n"
    assert len(one.given_back) == 2 and two.given_back == [other, other]
    reads = [a.send(b"get q\r\n") for _ in range(6)] + [b.send(b"get r\r\n")]
    assert reads == [b"VALUE q 0 2\r\n%s\r\nEND\r\n" % data for data in (b"a1", b"b1", b"a3", b"a4", b"b2")] + [
        b"END\r\n", b"VALUE r 0 2\r\na2\r\nEND\r\n"]


def test_a_lone_sets_result_is_put_in_the_list_its_connections_last_answer_kept(tmp_path):
    # two connections interleaved, their SETs stored and refused in turn: each connection's
    # answer keeps its one-result list, which the queue fills with that connection's next SET's
    # result (never the other's); a GET's answer keeps no list (its item goes with it)
    world = World(tmp_path, queues={"q": QueueConfig(max_item_size=2)})
    try:
        a, b = world.connect(), world.connect()

        def kept(client):
            return client.ref.weak_actor().spare.answer.results

        assert a.send(b"set q 0 0 2\r\na1\r\n") == b"STORED\r\n"
        assert b.send(b"set q 0 0 3\r\nbig\r\n") == b"NOT_STORED\r\n"
        first, other = kept(a), kept(b)
        assert (first, other) == ([True], [False]) and first is not other
        assert a.send(b"set q 0 0 3\r\nbig\r\n") == b"NOT_STORED\r\n"
        assert b.send(b"set q 0 0 2\r\nb1\r\n") == b"STORED\r\n"
        assert kept(a) is first and kept(b) is other and (first, other) == ([False], [True])
        assert a.send(b"get q\r\n") == b"VALUE q 0 2\r\na1\r\nEND\r\n"
        assert kept(a) == []
        assert a.send(b"set q 0 0 2\r\na2\r\nset q 0 0 3\r\nbig\r\n") == b"STORED\r\nNOT_STORED\r\n"
        assert a.send(b"set q 0 0 2\r\na3\r\n") == b"STORED\r\n"
        assert kept(a) == [True]
        reads = [b.send(b"get q\r\n") for _ in range(4)]
        assert reads == [b"VALUE q 0 2\r\n%s\r\nEND\r\n" % data for data in (b"b1", b"a2", b"a3")] + [b"END\r\n"]
    finally:
        world.collection.stop()


def test_pipelined_requests_answered_in_order_in_one_write(world):
    client = world.connect()
    sent = client.send(b"set a 0 0 1\r\n1\r\nset b 0 0 1\r\n2\r\nget a\r\nget b\r\nget a\r\n")
    assert sent == b"STORED\r\nSTORED\r\nVALUE a 0 1\r\n1\r\nEND\r\nVALUE b 0 1\r\n2\r\nEND\r\nEND\r\n"


def test_the_session_records_an_open_read_and_gives_it_back_on_hang_up(world):
    writer, reader = world.connect(), world.connect()
    writer.send(b"set q 0 0 1\r\nx\r\n")
    assert reader.send(b"get q/open\r\n") == b"VALUE q 0 1\r\nx\r\nEND\r\n"
    assert writer.send(b"get q\r\n") == b"END\r\n"  # open, so no one else gets it
    reader.hang_up()
    assert reader.transport.closed and world.finished == [reader.session]
    assert writer.send(b"get q\r\n") == b"VALUE q 0 1\r\nx\r\nEND\r\n"


def test_close_confirms_the_open_read(world):
    client = world.connect()
    client.send(b"set q 0 0 1\r\nx\r\n")
    client.send(b"get q/open\r\n")
    assert client.send(b"get q/close\r\n") == b"END\r\n"
    client.hang_up()
    assert world.connect().send(b"get q\r\n") == b"END\r\n"  # confirmed: gone for good


def test_a_waiting_get_is_answered_by_a_later_set(world):
    waiter, writer = world.connect(), world.connect()
    assert waiter.send(b"get late/t=%d\r\n" % LONG_WAIT_MS) == b""  # parked in the queue's wait-list
    writer.send(b"set late 0 0 4\r\nlate\r\n")
    settle()
    assert waiter.transport.take() == b"VALUE late 0 4\r\nlate\r\nEND\r\n"


def test_a_backed_up_transport_holds_the_next_batch(world):
    client = world.connect()
    client.transport.backed_up = True
    assert client.send(b"set q 0 0 1\r\nx\r\n") == b""
    client.transport.backed_up = False
    Dispatcher.current().deliver(client.ref, Received([]))  # the transport resumes reading
    settle()
    assert client.transport.take() == b"STORED\r\n"


def test_shutdown_and_reload_are_messages_to_the_server(world):
    client = world.connect()
    assert client.send(b"reload\r\n") == b"Reloaded config.\r\n"
    client.send(b"shutdown\r\n")
    assert [type(message) for message in world.control.told] == [Reload, Shutdown]


def test_the_text_handler_is_a_sibling_on_the_same_session(world):
    text, memcache = world.connect(TextHandler), world.connect()
    assert text.send(b"put tq:\nA\nB\n\n") == b"+2\n"
    assert text.send(b"get tq\n") == b":A\n"
    assert text.send(b"get tq\n") == b":B\n"  # confirms A first
    text.hang_up()  # B was open: it goes back
    assert memcache.send(b"get tq\r\n") == b"VALUE tq 0 1\r\nB\r\nEND\r\n"
    assert not issubclass(TextHandler, MemcacheHandler) and not issubclass(MemcacheHandler, TextHandler)


def test_monitor_streams_items_then_ends(world):
    client = world.connect()
    client.send(b"set m 0 0 1\r\n1\r\nset m 0 0 1\r\n2\r\n")
    assert client.send(b"monitor m 1 5\r\n") == b"VALUE m 0 1\r\n1\r\nEND\r\nVALUE m 0 1\r\n2\r\nEND\r\n"
    gevent.sleep(1.1)
    settle()
    assert client.transport.take() == b"END\r\n"  # the stream's end, once its seconds are up
    assert world.stats.cmd_monitor == 1


def test_a_monitor_keeps_the_queues_xids_and_confirms_with_them(world):
    client = world.connect()
    client.send(b"set m 0 0 1\r\n1\r\nset m 0 0 1\r\n2\r\n")
    core = world.queues["m"].weak_actor().core
    core._xid = 1000
    assert client.send(b"monitor m 5 2\r\n") == (b"VALUE m 0 1\r\n1\r\nEND\r\nVALUE m 0 1\r\n2\r\nEND\r\n"
                                                b"END\r\n")
    held = list(client.ref.weak_actor().open_reads["m"])
    assert held == list(core.open_reads) == [1001, 1002]
    assert client.send(b"confirm m 2\r\n") == b"END\r\n"
    assert not core.open_reads
    client.hang_up()
    assert world.connect().send(b"get m\r\n") == b"END\r\n"  # confirmed: gone for good


def test_a_write_pipelined_behind_a_read_is_refused_while_writes_are_blocked(world):
    client = world.connect()
    client.send(b"set a 0 0 1\r\n1\r\n")
    world.context.status.set(Status.READ_ONLY)
    # one batch: the session checks only its first request (a read) before the lookup,
    # so the SET is refused as it is compiled, as if it had come alone: SERVER_ERROR and a close
    assert client.send(b"get a\r\nset a 0 0 1\r\n2\r\nget a\r\n") == b"VALUE a 0 1\r\n1\r\nEND\r\nSERVER_ERROR\r\n"
    assert client.transport.closed
    assert world.stats.cmd_set == 1


class _FailingOnPeek(MemcacheHandler):
    """A handler with a bug: answering a peek raises (issue 17 case 5's crash stood for any)."""

    def add_reply(self, command, results, start, end, out):
        if getattr(command, "peek", False):
            raise RuntimeError("a bug in the handler")
        super().add_reply(command, results, start, end, out)


def test_a_handler_that_raises_closes_its_connection_and_gives_back_what_it_held(world):
    """An exception in a connection's handler closes that connection and is logged; it is
    never left waiting for a reply. Its open reads go back as on a hang-up."""
    writer = world.connect()
    writer.send(b"set q 0 0 1\r\nx\r\nset p 0 0 1\r\ny\r\n")
    buggy = world.connect(_FailingOnPeek)
    assert buggy.send(b"get q/open\r\n") == b"VALUE q 0 1\r\nx\r\nEND\r\n"
    with structlog.testing.capture_logs() as logs:
        assert buggy.send(b"get p/peek\r\nversion\r\n") == b""
    assert buggy.transport.closed and world.finished == [buggy.session]
    [line] = [entry for entry in logs if entry["event"].startswith("connection handler failed")]
    assert line["log_level"] == "error" and "a bug in the handler" in line["error"]
    assert writer.send(b"get q\r\n") == b"VALUE q 0 1\r\nx\r\nEND\r\n"  # the open read came back
    assert writer.send(b"get p\r\n") == b"VALUE p 0 1\r\ny\r\nEND\r\n"


# -- the shutdown's drain -----------------------------------------------------------------------


def test_drain_answers_a_waiting_read_and_nothing_after_it(world):
    """Kestrel evicts waiters at shutdown: the blocking read is answered, then the connection
    closes; what the client pipelined behind it is neither run nor answered."""
    client = world.connect()
    assert client.send(b"get q/t=%d\r\nset q 0 0 1\r\nx\r\n" % LONG_WAIT_MS) == b""
    assert client.drain() == b"END\r\n"
    assert client.transport.closed and world.finished == [client.session]
    assert world.connect().send(b"get q\r\n") == b"END\r\n"  # the SET never ran


def test_drain_ends_a_monitor_and_leaves_open_reads_open(world):
    """Open reads are not aborted into the journal at shutdown (behaviour §7.4): the next
    start backs them out, in xid order."""
    writer, reader, monitor = world.connect(), world.connect(), world.connect()
    writer.send(b"set q 0 0 1\r\na\r\nset q 0 0 1\r\nb\r\n")
    assert reader.send(b"get q/open\r\n") == b"VALUE q 0 1\r\na\r\nEND\r\n"
    assert monitor.send(b"monitor q 5 2\r\n") == b"VALUE q 0 1\r\nb\r\nEND\r\n"  # waits for a second
    assert monitor.drain() == b"END\r\n"  # the stream's end, now
    assert reader.drain() == b""
    assert reader.transport.closed and monitor.transport.closed
    assert writer.send(b"get q\r\n") == b"END\r\n"
    assert world.stats.cmd_get_open_dropped == 0


def test_a_confirm_answered_before_the_drain_stays_confirmed(world):
    client = world.connect()
    client.send(b"set q 0 0 1\r\nx\r\n")
    client.send(b"get q/open\r\n")
    assert client.send(b"get q/close\r\n") == b"END\r\n"
    assert client.drain() == b""
    assert world.connect().send(b"get q\r\n") == b"END\r\n"


def test_a_new_session_finds_a_queue_that_exists_without_asking_the_collection(world):
    assert world.connect().send(b"set known 0 0 1\r\na\r\n") == b"STORED\r\n"
    world.collection.stop()  # from here on a lookup through the collection reaches no one
    assert world.connect().send(b"get known\r\n") == b"VALUE known 0 1\r\na\r\nEND\r\n"


def test_a_finished_session_is_freed_without_the_cyclic_collector(world):
    """Its actor, mailbox, ref and handler refer to one another until it ends: then they let go,
    and reference counting frees the connection (ADR 0020), no collector pass needed."""
    import gc

    from kestrel_actors.messages import Session
    from kestrel_actors.session import Disconnected, SessionActor

    from ..helpers import BufferTransport

    gc.collect()
    gc.disable()
    try:
        session = Session(1, "in-process")
        ref = SessionActor.start_unlisted(world.context, BufferTransport(), session, MemcacheHandler)
        Dispatcher.current().deliver(ref, Received(MemcacheDecoder().feed(b"get waits/t=1000/open\r\n")))
        settle()
        Dispatcher.current().deliver(ref, Disconnected())
        settle()
        assert not ref.is_alive()
        assert not [kept for kept in gc.get_objects() if isinstance(kept, SessionActor) and kept.session is session]
    finally:
        gc.enable()
