"""The gevent runtime for pykka: tell, ask, exceptions, stop and dead letters, on gevent."""

from __future__ import annotations

import gevent
import pykka
import pytest

from kestrel_actors.actors import GeventActor, GeventFuture, ReplyFuture


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
            dead.append(message)

    actor = StopsEarly.start()
    actor.tell("stop-now")
    actor.tell("a")
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
