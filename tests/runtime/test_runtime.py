"""The gevent runtime for pykka: tell, ask, exceptions, stop and dead letters, on gevent."""

from __future__ import annotations

import gevent
import gevent.event
import pykka
import pytest

from kestrel_actors.runtime import GeventActor, GeventFuture, ReplyFuture

from ..helpers import PATIENCE


class Recorder(GeventActor):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[object] = []
        self.dead: list[object] = []
        self.started_on = None

    def on_start(self) -> None:
        self.started_on = gevent.getcurrent()

    def on_receive(self, message):
        if message == "boom":
            raise ValueError("boom")
        if message == "where":
            return gevent.getcurrent() is self.started_on
        if isinstance(message, tuple) and message[0] == "reply-later":
            message[1].tell(("later", message[2]))
            return None
        self.seen.append(message)
        return len(self.seen)

    def on_dead_letter(self, message):
        self.dead.append(message)

    def get_seen(self):
        return list(self.seen)


@pytest.fixture
def actor():
    ref = Recorder.start()
    yield ref
    if ref.is_alive():
        ref.stop()


def test_tell_is_processed_in_order(actor):
    for i in range(100):
        actor.tell(i)
    assert actor.ask("last") == 101
    assert actor.proxy().get_seen().get()[:100] == list(range(100))


def test_ask_returns_a_gevent_future_and_runs_on_the_actor_greenlet(actor):
    future = actor.ask("x", block=False)
    assert isinstance(future, GeventFuture)
    assert future.get(timeout=1) == 1
    assert actor.ask("where") is True


def test_exception_in_handler_reaches_the_asker_and_the_actor_survives(actor):
    with pytest.raises(ValueError, match="boom"):
        actor.ask("boom", timeout=1)
    assert actor.is_alive()
    assert actor.ask("after") == 1


def test_ask_timeout_raises_pykka_timeout():
    class Slow(GeventActor):
        def on_receive(self, message):
            gevent.sleep(0.5)

    ref = Slow.start()
    try:
        with pytest.raises(pykka.Timeout):
            ref.ask("x", timeout=0.05)
    finally:
        ref.stop()


def test_stop_ends_the_actor_and_later_tells_fail(actor):
    actor.stop()
    assert not actor.is_alive()
    with pytest.raises(pykka.ActorDeadError):
        actor.tell("late")
    with pytest.raises(pykka.ActorDeadError):
        actor.ask("late")


def test_tells_left_in_the_inbox_at_stop_become_dead_letters():
    dead: list[object] = []

    class StopsEarly(Recorder):
        def on_receive(self, message):
            if message == "stop-now":
                self._stop()
                return None
            return super().on_receive(message)

        def on_dead_letter(self, message):
            if message == "bad":
                raise ValueError("cannot answer this one")  # logged; the rest still answered
            dead.append(message)

    actor = StopsEarly.start()
    actor.tell("stop-now")
    actor.tell("a")
    actor.tell("bad")
    actor.tell("b")
    gevent.sleep(0.05)
    assert not actor.is_alive()
    assert dead == ["a", "b"]


def test_reply_later_through_a_kept_reply_future(actor):
    reply = ReplyFuture()
    actor.tell(("reply-later", reply, 7))
    assert reply.get(timeout=1) == ("later", 7)


def test_done_callback_fires_on_the_hub():
    future = GeventFuture()
    seen = []
    future.add_done_callback(lambda f: seen.append(f.get()))
    gevent.spawn_later(0.01, future.set, 5)
    assert future.get(timeout=1) == 5
    gevent.sleep(0)
    assert seen == [5]


def test_many_actors_interleave_on_one_thread():
    actors = [Recorder.start() for _ in range(50)]
    try:
        futures = [a.ask(i, block=False) for i, a in enumerate(actors)]
        assert pykka.get_all(futures, timeout=2) == [1] * 50
    finally:
        for a in actors:
            a.stop()


# -- inline dispatch (ADR 0002) ------------------------------------------------------------


class Inline(GeventActor):
    """Records where and in what order it handles messages; may tell a peer."""

    inline_dispatch = True

    def __init__(self, log: list, name: str) -> None:
        super().__init__()
        self.log = log
        self.name = name
        self.peer = None
        self.running = False
        self.greenlet = None

    def on_start(self) -> None:
        self.greenlet = gevent.getcurrent()

    def on_receive(self, message):
        assert not self.running, "a handler ran re-entrantly"
        _counted(self.mailbox)
        self.running = True
        try:
            kind = message[0]
            on_own = gevent.getcurrent() is self.greenlet
            self.log.append((self.name, "start", message[1], on_own))
            if kind == "ping" and self.peer is not None:
                self.peer.tell(("pong", message[1]))
            elif kind == "pong" and self.peer is not None and message[1] < 3:
                self.peer.tell(("ping", message[1] + 1))
            elif kind == "boom":
                raise ValueError("boom")
            elif kind == "stop":
                self._stop()
            self.log.append((self.name, "end", message[1], on_own))
        finally:
            self.running = False

    def on_inbox_empty(self) -> None:
        _counted(self.mailbox)
        self.log.append((self.name, "idle"))

    def on_dead_letter(self, message):
        self.log.append((self.name, "dead", message[1]))


def _counted(mailbox) -> None:
    """The count of a mailbox's entries that the runtime reads is its deque's length, whichever
    way each entry came (a busy actor's tell, a put back, an ask, a failure, a stop)."""
    assert mailbox.items.count == len(mailbox.items.items), (mailbox.items.count, list(mailbox.items.items))


@pytest.fixture
def inline_pair():
    log: list = []
    a, b = Inline.start(log, "a"), Inline.start(log, "b")
    gevent.sleep(0.01)  # both greenlets park on an empty inbox: now idle
    a.proxy().peer = b
    b.proxy().peer = a
    gevent.sleep(0.01)
    log.clear()
    yield log, a, b
    for ref in (a, b):
        _counted(ref.mailbox)
        if ref.is_alive():
            ref.stop()


def test_tell_to_an_idle_inline_actor_runs_on_the_callers_greenlet(inline_pair):
    log, a, _b = inline_pair
    a.tell(("note", 1))
    # handled before tell returned, on this (the test's) greenlet, then the idle hook ran
    assert log == [("a", "start", 1, False), ("a", "end", 1, False), ("a", "idle")]


def test_inline_actors_never_run_reentrantly_and_keep_order(inline_pair):
    log, a, _b = inline_pair
    a.tell(("ping", 0))
    starts = [(e[0], e[2]) for e in log if e[1] == "start"]
    assert starts == [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2), ("b", 2), ("a", 3), ("b", 3)]
    # each handler ended before the next one of the same actor started
    for name in "ab":
        mine = [e[1] for e in log if e[0] == name and e[1] in ("start", "end")]
        assert mine == ["start", "end"] * (len(mine) // 2)


def test_tell_from_the_hub_wakes_the_actors_own_greenlet(inline_pair):
    log, a, _b = inline_pair
    gevent.get_hub().loop.run_callback(a.tell, ("note", 2))
    gevent.sleep(0.01)
    assert ("a", "start", 2, True) in log


def test_ask_to_an_inline_actor_runs_on_its_own_greenlet():
    class Where(GeventActor):
        inline_dispatch = True

        def on_start(self):
            self.greenlet = gevent.getcurrent()

        def on_receive(self, message):
            return gevent.getcurrent() is self.greenlet

    ref = Where.start()
    try:
        gevent.sleep(0.01)
        assert ref.ask("where", timeout=1) is True
    finally:
        ref.stop()


def test_an_inline_failure_stops_the_actor_not_the_caller(inline_pair):
    _log, a, _b = inline_pair
    a.tell(("boom", 1))  # no exception here: a tell has no one to report to
    gevent.sleep(0.01)
    assert not a.is_alive()
    with pytest.raises(pykka.ActorDeadError):
        a.tell(("note", 2))


def test_a_stop_inside_an_inline_handler_turns_what_is_queued_into_dead_letters(inline_pair):
    log, a, _b = inline_pair

    class Relay(GeventActor):
        inline_dispatch = True

        def on_receive(self, message):
            a.tell(("stop", 1))  # a is busy (it is telling us): these two queue up
            a.tell(("note", 2))

    relay = Relay.start()
    gevent.sleep(0.01)
    a.proxy().peer = relay
    gevent.sleep(0.01)
    log.clear()
    a.tell(("ping", 0))  # a runs inline here, relay inline inside it; then a drains "stop"
    gevent.sleep(0.01)  # a's own greenlet wakes for the teardown
    relay.stop()
    assert not a.is_alive()
    assert ("a", "start", 1, False) in log  # the stop ran inline, on this greenlet
    assert ("a", "dead", 2) in log
    assert not any(e[:3] == ("a", "start", 2) for e in log)


def test_an_ask_that_reaches_a_busy_inline_actor_goes_to_its_greenlet_with_what_follows(inline_pair):
    """An ask and a tell queued while ``a`` runs inline: its run takes the ask out, puts it back
    for ``a``'s greenlet, which answers it and then handles the tell (the mailbox's count of its
    entries checked at every step: ``_counted``)."""
    log, a, _b = inline_pair
    asked = []

    class Relay(GeventActor):
        inline_dispatch = True

        def on_receive(self, message):
            asked.append(a.ask(("note", 5), block=False))  # a is busy (it is telling us): queued
            a.tell(("note", 6))

    relay = Relay.start()
    gevent.sleep(0.01)
    a.proxy().peer = relay
    gevent.sleep(0.01)
    log.clear()
    a.tell(("ping", 0))  # a runs inline here, relay inline inside it
    assert asked[0].get(timeout=1) is None
    gevent.sleep(0.01)
    relay.stop()
    starts = [(e[2], e[3]) for e in log if e[:2] == ("a", "start")]
    assert starts == [(0, False), (5, True), (6, True)]  # the ask and the tell on a's own greenlet


def test_the_dispatcher_tells_in_order_from_a_greenlet_not_the_hub(inline_pair):
    from kestrel_actors.runtime import Dispatcher

    log, a, b = inline_pair
    a.proxy().peer = None
    b.proxy().peer = None
    gevent.sleep(0.01)
    log.clear()
    dispatcher = Dispatcher.current()
    loop = gevent.get_hub().loop
    for i in range(5):  # from hub callbacks, as the transport does
        loop.run_callback(dispatcher.deliver, a if i % 2 == 0 else b, ("note", i))
    gevent.sleep(0.02)
    starts = [(e[0], e[2], e[3]) for e in log if e[1] == "start"]
    # inline on the dispatcher's greenlet (not on the actors' own), in the order delivered
    assert starts == [("a", 0, False), ("b", 1, False), ("a", 2, False), ("b", 3, False), ("a", 4, False)]


def test_a_suspended_dispatcher_does_not_hold_up_other_actors():
    from kestrel_actors.runtime import Dispatcher

    release = gevent.event.Event()
    seen: list = []

    class Slow(GeventActor):
        inline_dispatch = True

        def on_receive(self, message):
            release.wait()  # suspends the greenlet it runs on (journal work does, rarely)
            seen.append(("slow", message))

    class Quick(GeventActor):
        inline_dispatch = True

        def on_receive(self, message):
            seen.append(("quick", message))

    slow, quick = Slow.start(), Quick.start()
    try:
        gevent.sleep(0.01)
        dispatcher = Dispatcher.current()
        loop = gevent.get_hub().loop
        loop.run_callback(dispatcher.deliver, slow, 1)
        gevent.sleep(0.01)
        loop.run_callback(dispatcher.deliver, quick, 2)
        loop.run_callback(dispatcher.deliver, slow, 3)  # queued behind 1 in slow's inbox
        gevent.sleep(0.02)
        assert seen == [("quick", 2)]
        release.set()
        gevent.sleep(0.02)
        assert seen == [("quick", 2), ("slow", 1), ("slow", 3)]
    finally:
        release.set()
        slow.stop()
        quick.stop()


def test_an_actor_with_greenlet_on_demand_gets_its_greenlet_only_when_needed():
    seen: list = []

    class Lazy(GeventActor):
        inline_dispatch = True
        greenlet_on_demand = True

        def on_receive(self, message):
            seen.append((message, gevent.getcurrent()))
            if message == "bye":
                self.stop()  # pykka's stop next: pykka's loop runs here, and ends at once

        def on_stop(self):
            seen.append(("on_stop", gevent.getcurrent()))

    ref = Lazy.start()
    mailbox = ref.actor_inbox
    ref.tell("hello")
    assert seen == [("hello", gevent.getcurrent())] and mailbox.greenlet is None
    ref.tell("bye")
    assert not ref.is_alive() and mailbox.greenlet is None  # stopped before tell returned
    assert seen[-1] == ("on_stop", gevent.getcurrent())

    asked = Lazy.start()
    asked.ask("question", timeout=1)  # an ask runs on the actor's own greenlet: spawned now
    assert asked.actor_inbox.greenlet is not None and seen[-1][1] is asked.actor_inbox.greenlet
    asked.stop()


# -- running on the hub: may_run_on_hub, on_own_greenlet, the dispatcher's tell_from_hub --------


class HubSafe(GeventActor):
    """An inline actor that says whether it may run on the hub (``allowed``) and records
    where each message ran: on the hub, or elsewhere."""

    inline_dispatch = True

    def __init__(self, log: list, allowed: list) -> None:
        super().__init__()
        self.log = log
        self.allowed = allowed  # a one-element list, so a test can change the answer

    def may_run_on_hub(self) -> bool:
        return self.allowed[0]

    def on_receive(self, message):
        on_hub = gevent.getcurrent() is gevent.get_hub()
        self.log.append((message, on_hub))
        if message == "close-the-door":
            self.allowed[0] = False  # what comes next in the same drain must leave the hub
            self.actor_ref.tell("after")


def _hub_safe(allowed: bool) -> tuple[list, list, pykka.ActorRef]:
    log: list = []
    flag = [allowed]
    ref = HubSafe.start(log, flag)
    return log, flag, ref


def test_a_tell_from_the_hub_runs_inline_there_when_the_actor_may_run_on_the_hub():
    log, _flag, ref = _hub_safe(True)
    try:
        gevent.get_hub().loop.run_callback(ref.tell, "from-hub")
        gevent.sleep(0.01)
        assert log == [("from-hub", True)]
    finally:
        ref.stop()


def test_a_tell_from_the_hub_goes_to_the_actors_greenlet_when_it_may_not():
    log, _flag, ref = _hub_safe(False)
    try:
        gevent.get_hub().loop.run_callback(ref.tell, "from-hub")
        gevent.sleep(0.01)
        assert log == [("from-hub", False)]
    finally:
        ref.stop()


def test_the_hub_drain_asks_again_before_each_further_message():
    log, _flag, ref = _hub_safe(True)
    try:
        gevent.get_hub().loop.run_callback(ref.tell, "close-the-door")
        gevent.sleep(0.01)
        # the first ran on the hub; the one it queued waited for the actor's own greenlet
        assert log == [("close-the-door", True), ("after", False)]
    finally:
        ref.stop()


def test_a_message_marked_on_own_greenlet_never_runs_inline():
    from kestrel_actors.runtime import on_own_greenlet

    @on_own_greenlet
    class Heavy:
        pass

    seen: list = []

    class Worker(GeventActor):
        inline_dispatch = True

        def may_run_on_hub(self) -> bool:
            return True

        def on_start(self):
            self.greenlet = gevent.getcurrent()

        def on_receive(self, message):
            seen.append((type(message).__name__, gevent.getcurrent() is self.greenlet))

    ref = Worker.start()
    try:
        gevent.sleep(0.01)
        ref.tell("light")  # an ordinary message runs inline, here
        ref.tell(Heavy())  # from this greenlet: not inline
        gevent.sleep(0.01)
        gevent.get_hub().loop.run_callback(ref.tell, Heavy())  # from the hub: not inline either
        gevent.sleep(0.01)
        assert seen == [("str", False), ("Heavy", True), ("Heavy", True)]
    finally:
        ref.stop()


class Relay(GeventActor):
    """A hub-safe inline actor that logs each message's start and end, and on ``(word, tells)``
    makes each tell ``(ref, message)`` of ``tells`` in order."""

    inline_dispatch = True

    def __init__(self, name: str, log: list) -> None:
        super().__init__()
        self.name = name
        self.log = log

    def may_run_on_hub(self) -> bool:
        return True

    def on_receive(self, message):
        word, tells = message
        self.log.append((self.name, word, gevent.getcurrent() is gevent.get_hub()))
        for ref, told in tells:
            ref.tell(told)
        self.log.append((self.name, "end " + word))


def test_on_the_hub_the_readers_a_request_wakes_are_served_after_its_own_answer():
    """A session asks a queue; the queue answers it, then hands an item to a waiting reader.
    On the hub the queue runs inside the session's handler, as before, but the reader it tells
    from there waits until the session's run is over: the session answers its own client
    first. Nested (off the hub, as before) the reader is served inside the queue's run, while
    the queue's answer waits in the busy session's inbox."""
    log: list = []
    session, queue, reader = (Relay.start(name, log) for name in ("session", "queue", "reader"))
    try:
        run = ("run", [(session, ("answer", [])), (reader, ("item", []))])
        gevent.get_hub().loop.run_callback(session.tell, ("request", [(queue, run)]))
        gevent.sleep(0.01)
        assert log == [
            ("session", "request", True), ("queue", "run", True), ("queue", "end run"),
            ("session", "end request"), ("session", "answer", True), ("session", "end answer"),
            ("reader", "item", True), ("reader", "end item"),
        ]
        log.clear()
        session.tell(("request", [(queue, run)]))  # off the hub: inside the sender's run, as before
        assert [entry[:2] for entry in log] == [
            ("session", "request"), ("queue", "run"), ("reader", "item"), ("reader", "end item"),
            ("queue", "end run"), ("session", "end request"), ("session", "answer"),
            ("session", "end answer"),
        ]
    finally:
        for ref in (session, queue, reader):
            ref.stop()


def test_on_the_hub_an_actor_told_from_a_nested_run_takes_its_messages_in_order_afterwards():
    log: list = []
    first, second, third = (Relay.start(name, log) for name in ("first", "second", "third"))
    try:
        relay = ("relay", [(third, ("one", [])), (third, ("two", []))])
        tells = [(second, relay), (third, ("three", []))]
        gevent.get_hub().loop.run_callback(first.tell, ("start", tells))
        gevent.sleep(0.01)
        assert [entry[:2] for entry in log] == [
            ("first", "start"), ("second", "relay"), ("second", "end relay"), ("first", "end start"),
            ("third", "one"), ("third", "end one"), ("third", "two"), ("third", "end two"),
            ("third", "three"), ("third", "end three"),
        ]
        assert all(entry[2] for entry in log if len(entry) == 3)  # every run on the hub
    finally:
        for ref in (first, second, third):
            ref.stop()


def test_tell_from_hub_tells_at_once_only_when_nothing_else_is_ready():
    """One ready socket: its callback's tell runs the receiver on the hub, no dispatcher.
    Several sockets ready in one loop iteration: their tells go through the dispatcher, all
    together after the iteration's callbacks, so that an end-of-burst hook still sees the whole
    burst; a receiver that may run on the hub runs there (no greenlet switch), in order.

    The lone socket is alone in its loop iteration because this test arms no timer that could
    come due with it: it waits for the socket's callback on an event whose only timer is the
    clients' patience (a ``gevent.sleep`` would be a timer due in the same iteration whenever
    load held the process back past it)."""
    import socket
    import time

    from kestrel_actors.runtime import Dispatcher

    log, _flag, ref = _hub_safe(True)
    dispatcher = Dispatcher.current()
    loop = gevent.get_hub().loop
    pairs = [socket.socketpair() for _ in range(3)]
    watchers = []
    called: list[int] = []
    lone_done = gevent.event.Event()
    try:
        for number, (ours, _theirs) in enumerate(pairs):
            ours.setblocking(False)
            watcher = loop.io(ours.fileno(), 1)

            def readable(ours=ours, number=number):
                ours.recv(16)
                dispatcher.tell_from_hub(ref, f"socket-{number}")
                called.append(number)
                lone_done.set()

            watcher.start(readable)
            watchers.append(watcher)
        pairs[0][1].send(b"x")
        assert lone_done.wait(PATIENCE)
        assert log == [("socket-0", True)]  # told, and run, before its callback returned
        log.clear()
        due_seen = []

        def readable_seen(ours=pairs[0][0]):
            ours.recv(16)
            dispatcher.tell_from_hub(ref, "socket-0")
            due_seen.append(dispatcher.due)  # handed over, not told yet

        watchers[0].stop()
        watchers[0].start(readable_seen)
        for _ours, theirs in pairs:  # three at once: one loop iteration sees them all
            theirs.send(b"x")
        deadline = time.monotonic() + PATIENCE
        while len(log) < 3 and time.monotonic() < deadline:
            gevent.sleep(0.01)
        assert sorted(log) == [("socket-0", True), ("socket-1", True), ("socket-2", True)]
        assert due_seen and due_seen[0] >= 1
        assert sorted(called) == [0, 1, 2]  # the lone socket's, then the burst's two others
    finally:
        for watcher in watchers:
            watcher.stop()
        for ours, theirs in pairs:
            ours.close()
            theirs.close()
        ref.stop()


def test_a_burst_larger_than_hub_burst_max_is_told_from_a_greenlet_in_order():
    """Up to ``HUB_BURST_MAX`` tells a burst runs on the hub; a larger one on a dispatcher
    greenlet, where each tell costs less (its two switches are shared by the whole burst)."""
    from kestrel_actors.runtime import Dispatcher

    log, _flag, ref = _hub_safe(True)
    dispatcher = Dispatcher.current()
    loop = gevent.get_hub().loop
    try:
        for size in (Dispatcher.HUB_BURST_MAX, Dispatcher.HUB_BURST_MAX + 1):
            log.clear()
            for number in range(size):  # from hub callbacks of one loop iteration
                loop.run_callback(dispatcher.deliver, ref, number)
            gevent.sleep(0.02)
            on_hub = size <= Dispatcher.HUB_BURST_MAX
            assert log == [(number, on_hub) for number in range(size)]
    finally:
        ref.stop()


# -- pykka's loop does the work (issue 25.2) -------------------------------------------------------


def test_an_inline_failure_runs_on_failure_on_the_actors_own_greenlet():
    seen: list = []

    class Fails(GeventActor):
        inline_dispatch = True

        def on_start(self):
            self.greenlet = gevent.getcurrent()

        def on_receive(self, message):
            seen.append(("handled", gevent.getcurrent() is self.greenlet))
            raise ValueError("boom")

        def on_failure(self, *exc_info):
            seen.append(("on_failure", gevent.getcurrent() is self.greenlet, exc_info[0]))

    ref = Fails.start()
    gevent.sleep(0.01)
    ref.tell("x")  # inline, on this greenlet; pykka's loop then fails the actor on its own
    gevent.sleep(0.01)
    assert seen == [("handled", False), ("on_failure", True, ValueError)]
    assert not ref.is_alive()


def test_a_greenlet_killed_while_it_runs_a_handler_inline_fails_that_actor_alone():
    release = gevent.event.Event()

    class Waits(GeventActor):
        inline_dispatch = True

        def on_receive(self, message):
            release.wait()  # the sender's greenlet suspends here

    bystander = Recorder.start()
    ref = Waits.start()
    try:
        gevent.sleep(0.01)
        sender = gevent.spawn(ref.tell, "x")
        gevent.sleep(0.01)
        sender.kill()  # GreenletExit thrown into the sender, inside the actor's handler
        assert sender.dead and isinstance(sender.value, gevent.GreenletExit)
        gevent.sleep(0.01)
        assert not ref.is_alive()  # its handler was cut short: it fails
        assert bystander.is_alive() and bystander.ask("still here", timeout=1) == 1  # no stop_all
    finally:
        release.set()
        bystander.stop()


def test_actor_stopped_wait_blocks_only_the_calling_greenlet(actor):
    stopper = gevent.spawn_later(0.05, actor.stop)
    assert actor.actor_stopped.wait(2) is True  # the hub ran on: the stop was handled
    assert not actor.is_alive() and stopper.join(1) is None
    assert Recorder.start().actor_stopped.wait(0.01) is False


def test_a_future_takes_one_value_as_pykka_says():
    import queue

    future = GeventFuture()
    future.set(1)
    with pytest.raises(queue.Full):
        future.set(2)
    hooked = GeventFuture()
    hooked.set_get_hook(lambda timeout: 3)
    with pytest.raises(queue.Full):
        hooked.set(4)
    assert (future.get(timeout=0), hooked.get(timeout=0)) == (1, 3)


class OnDemand(GeventActor):
    """Run by its senders until it needs its greenlet, as a session is."""

    inline_dispatch = True
    greenlet_on_demand = True

    def on_receive(self, message):
        return message


def test_an_unlisted_actor_that_has_ended_is_let_go_by_its_mailbox_and_its_ref():
    """Nothing refers back to it then, weakly either: reference counting frees it (a session's
    connection, ADR 0020). A weak reference left to a compiled actor freed that way pointed into
    freed memory, since the compiled dealloc does not clear them."""
    import weakref

    ref = OnDemand.start_unlisted()
    actor = ref.mailbox.actor
    ref.tell("hello")
    ref.stop()
    assert not ref.is_alive()
    assert ref.mailbox.actor is None
    assert weakref.getweakrefcount(actor) == 0
    assert ref._actor_weakref() is None


def test_an_actor_and_its_ref_have_one_urn():
    ref = GeventActor.start()
    try:
        actor = ref._actor_weakref()
        assert actor is not None
        assert actor.actor_urn == ref.actor_urn
        assert actor.actor_urn.startswith("urn:uuid:")
        # set on either side, read on both: one rule, kept in the ref
        actor.actor_urn = "urn:uuid:set-on-the-actor"
        assert ref.actor_urn == "urn:uuid:set-on-the-actor"
        ref.actor_urn = "urn:uuid:set-on-the-ref"
        assert actor.actor_urn == "urn:uuid:set-on-the-ref"
    finally:
        ref.stop()


def test_an_actor_that_never_ran_on_its_greenlet_ends_at_its_stop_as_pykkas_loop_would():
    """Its stop, told by its own handler (a session's at its end) while its greenlet was never
    needed, runs on the sender's greenlet: on_start, then on_stop, and no loop of pykka's (compiled,
    it costs a connection's end five interpreted calls); an on_start that fails stops it as
    pykka does, without on_stop."""
    seen: list = []

    class Ends(OnDemand):
        fail = False

        def on_start(self):
            seen.append("on_start")
            if self.fail:
                raise ValueError("on_start failed")

        def on_stop(self):
            seen.append("on_stop")

        def on_receive(self, message):
            if message == "bye":
                self.stop()

        def _actor_loop(self):
            seen.append("pykka's loop")
            super()._actor_loop()

    ref = Ends.start_unlisted()
    ref.tell("hello")
    ref.tell("bye")
    assert seen == ["on_start", "on_stop"]
    assert not ref.is_alive() and ref.mailbox.greenlet is None and not ref.mailbox.items.count
    seen.clear()
    Ends.fail = True
    ref = Ends.start_unlisted()
    ref.tell("bye")
    assert seen == ["on_start"]
    assert not ref.is_alive() and not ref.mailbox.items.count


def _started_on_the_hub() -> pykka.ActorRef:
    """A :class:`HubSafe` started in a callback of this thread's hub (as a session is, on accept)."""
    made: list = []
    gevent.get_hub().loop.run_callback(lambda: made.append(HubSafe.start([], [True])))
    while not made:
        gevent.sleep(0.001)
    return made[0]


def _own_hub_and_runs(ref: pykka.ActorRef) -> bool:
    mailbox = ref.actor_inbox
    hub = gevent.get_hub()
    return mailbox.hub is hub and mailbox.hub_runs.hub() is hub


def test_a_mailbox_made_on_a_hub_is_that_hubs_whichever_hub_made_the_last():
    # a mailbox made on a hub reuses what the last one made there found (every connection's
    # session); one made on another thread's hub in between, or off the hub, gets its own
    import threading

    first = _started_on_the_hub()
    elsewhere: list = []

    def other_thread() -> None:
        ref = _started_on_the_hub()
        again = _started_on_the_hub()
        elsewhere.extend([_own_hub_and_runs(ref), _own_hub_and_runs(again)])
        ref.stop()
        again.stop()

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join(PATIENCE)
    back = _started_on_the_hub()
    off_hub = HubSafe.start([], [True])  # made on this greenlet, not the hub's
    try:
        assert elsewhere == [True, True]
        assert _own_hub_and_runs(first) and _own_hub_and_runs(back) and _own_hub_and_runs(off_hub)
    finally:
        for ref in (first, back, off_hub):
            ref.stop()


# -- the dispatcher's due tells and a tell from a known greenlet (issue 56) ------------------------


def test_due_tells_keep_their_order_across_turns_while_a_dispatcher_is_suspended():
    """The due tells are one list read from a shared head: a burst left behind by a suspended
    dispatcher greenlet is told, in order and once each, by the next one, and the suspended
    one, resumed, tells nothing twice."""
    from kestrel_actors.runtime import Dispatcher

    release = gevent.event.Event()
    seen: list = []

    class Slow(GeventActor):
        inline_dispatch = True

        def on_receive(self, message):
            release.wait()  # suspends the dispatcher greenlet it runs on
            seen.append(("slow", message))

    class Quick(GeventActor):
        inline_dispatch = True

        def on_receive(self, message):
            seen.append(("quick", message))
            if message == 3:  # a tell handed over while the burst is told joins its end
                Dispatcher.current().deliver(self.actor_ref, 30)

    slow, quick = Slow.start(), Quick.start()
    dispatcher = Dispatcher.current()
    loop = gevent.get_hub().loop
    try:
        gevent.sleep(0.01)
        burst = [(slow, 1)] + [(quick, n) for n in range(2, 2 + Dispatcher.HUB_BURST_MAX)]
        for ref, message in burst:  # one loop turn, larger than a burst on the hub
            loop.run_callback(dispatcher.deliver, ref, message)
        gevent.sleep(0.02)
        assert seen == []  # the first tell suspended its greenlet: the rest wait for the next
        assert dispatcher.due == Dispatcher.HUB_BURST_MAX
        loop.run_callback(dispatcher.deliver, quick, 99)  # a later turn
        gevent.sleep(0.02)
        later = list(range(2, 2 + Dispatcher.HUB_BURST_MAX))
        assert seen == [("quick", n) for n in later] + [("quick", 99), ("quick", 30)]
        release.set()
        gevent.sleep(0.02)
        loop.run_callback(dispatcher.deliver, quick, 100)
        gevent.sleep(0.02)
        assert seen == [("quick", n) for n in later] + [("quick", 99), ("quick", 30), ("slow", 1), ("quick", 100)]
        assert dispatcher.due == 0
        assert dispatcher.tells == [] and dispatcher.head == 0  # emptied once all were told
    finally:
        release.set()
        slow.stop()
        quick.stop()


def test_a_stream_of_tells_that_never_lets_the_list_empty_does_not_keep_the_told_ones():
    """Each tell hands over the next before it returns, so the due list is never empty until
    the chain ends: the told entries are cut off as it goes, not held to its end."""
    from kestrel_actors.runtime import Dispatcher

    chain = 3 * Dispatcher.TOLD_KEPT_MAX
    lengths: list[int] = []
    done = gevent.event.Event()

    class Chain(GeventActor):
        inline_dispatch = True

        def on_receive(self, message):
            dispatcher = Dispatcher.current()
            lengths.append(len(dispatcher.tells))
            if message < chain:
                dispatcher.deliver(self.actor_ref, message + 1)
            else:
                done.set()

    ref = Chain.start()
    try:
        gevent.get_hub().loop.run_callback(Dispatcher.current().deliver, ref, 1)
        assert done.wait(PATIENCE)
        assert len(lengths) == chain
        assert max(lengths) <= Dispatcher.TOLD_KEPT_MAX + 4
    finally:
        ref.stop()


class Runner(GeventActor):
    """Records, for each message, whether its mailbox's ``runner`` is the greenlet running the
    handler (or None, which makes a tell ask); may tell a peer from its handler."""

    inline_dispatch = True

    def __init__(self, log: list, on_hub: bool) -> None:
        super().__init__()
        self.log = log
        self.on_hub = on_hub
        self.peer = None

    def may_run_on_hub(self) -> bool:
        return self.on_hub

    def on_receive(self, message):
        runner = self.mailbox.runner
        self.log.append((message, runner is None or runner is gevent.getcurrent(), gevent.getcurrent()))
        if self.peer is not None and message != "ask":
            self.peer.tell_from(message, runner)


def test_a_handlers_runner_is_the_greenlet_it_runs_on_wherever_it_runs():
    """``_Mailbox.runner``, which a handler's tell passes as its greenlet, is the greenlet that
    runs the handler: inline from a greenlet, on the hub, on a dispatcher greenlet, on the
    actor's own greenlet (an ask), and on another thread's hub."""
    import threading

    from kestrel_actors.runtime import Dispatcher

    log: list = []
    a = Runner.start(log, True)
    b = Runner.start(log, True)
    try:
        gevent.sleep(0.01)
        a.proxy().peer = b
        gevent.sleep(0.01)
        log.clear()
        hub = gevent.get_hub()
        a.tell("from-greenlet")  # both inline on this greenlet
        hub.loop.run_callback(a.tell, "from-hub")  # both on the hub (a hub run)
        gevent.sleep(0.01)
        dispatcher = Dispatcher.current()
        for n in range(Dispatcher.HUB_BURST_MAX + 1):
            hub.loop.run_callback(dispatcher.deliver, a, f"burst-{n}")  # on a dispatcher greenlet
        gevent.sleep(0.02)
        a.ask("ask", timeout=PATIENCE)  # a's own greenlet
        assert all(right for _message, right, _where in log), log
        where = {message: g for message, _right, g in log}
        assert where["from-greenlet"] is gevent.getcurrent()
        assert where["from-hub"] is hub
        assert where["burst-0"] is not hub and where["burst-0"] is not gevent.getcurrent()
        assert [message for message, _right, _g in log].count("burst-0") == 2  # a, then b
        assert where["ask"] is not hub
        log.clear()
        errors: list = []

        def other_thread() -> None:  # a tell made on another thread, whose hub is not theirs
            try:
                a.tell("thread")
            except BaseException as exc:  # noqa: BLE001 - reported to the test's thread
                errors.append(exc)

        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join(PATIENCE)
        assert not errors
        assert [(message, right) for message, right, _g in log] == [("thread", True), ("thread", True)]
    finally:
        a.stop()
        b.stop()


def test_tell_from_the_hub_runs_on_the_hub_and_from_a_greenlet_on_that_greenlet():
    """``tell_from`` with the teller's greenlet given does what ``tell`` does there, without
    asking ``getcurrent``; None asks."""
    log: list = []
    a = Runner.start(log, True)
    off = Runner.start(log, False)
    try:
        gevent.sleep(0.01)
        log.clear()
        hub = gevent.get_hub()
        hub.loop.run_callback(a.tell_from, "hub", hub)
        hub.loop.run_callback(off.tell_from, "hub-not-allowed", hub)  # to its own greenlet
        gevent.sleep(0.01)
        me = gevent.getcurrent()
        a.tell_from("given", me)
        a.tell_from("asked", None)
        where = {message: g for message, _right, g in log}
        assert where["hub"] is hub
        assert where["hub-not-allowed"] is not hub and where["hub-not-allowed"] is not me
        assert where["given"] is me and where["asked"] is me
        assert all(right for _message, right, _g in log)
    finally:
        a.stop()
        off.stop()
