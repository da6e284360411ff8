"""A gevent runtime for pykka: actors are greenlets, inboxes and futures are gevent primitives.

pykka 3+ ships only a threading runtime. On threads every actor hop is an OS-level handoff
(lock, condition, GIL transfer); on gevent it is a queue append and a greenlet switch on the
one hub thread, about half the cost, and the gap widens with many callers (see
``docs/adr/0001-actor-runtime.md``). The process is *not* monkey-patched: actors and the
network use gevent's own APIs, and anything that really blocks (fsync, Spark) goes to gevent's
threadpool or another process.

pykka exposes three hooks for a runtime, ``_create_actor_inbox``, ``_create_future`` and
``_start_actor_loop``; this module fills them with gevent primitives. It adds one thing
pykka lacks: a *dead letter* hook, so that a ``tell`` still in the inbox when an actor stops
is handed to :meth:`GeventActor.on_dead_letter` instead of vanishing silently. A queue actor
uses it to answer requests that raced with a ``delete``.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, TypeVar

import gevent
import gevent.event
import gevent.queue
import pykka
from pykka import ActorDeadError, Timeout, messages

__all__ = ["GeventActor", "GeventFuture", "ReplyFuture"]

_PYKKA_MESSAGES = frozenset(
    (messages._ActorStop, messages.ProxyCall, messages.ProxyGetAttr, messages.ProxySetAttr)  # noqa: SLF001
)

T = TypeVar("T")


class GeventFuture(pykka.Future[T]):
    """A pykka future backed by :class:`gevent.event.AsyncResult`.

    ``get()`` blocks the calling greenlet only, never the hub. Besides pykka's API it offers
    :meth:`add_done_callback`, which lets an actor react to a reply *later* (as a message to
    itself) rather than blocking in a handler.
    """

    def __init__(self) -> None:
        super().__init__()
        self._result = gevent.event.AsyncResult()

    def get(self, *, timeout: float | None = None) -> Any:
        try:
            return super().get(timeout=timeout)
        except NotImplementedError:
            pass
        try:
            return self._result.get(timeout=timeout)
        except gevent.Timeout as exc:
            raise Timeout(f"{timeout} seconds") from exc

    def set(self, value: Any | None = None) -> None:
        if self._result.ready():
            raise ValueError("future already set")
        self._result.set(value)

    def set_exception(self, exc_info: Any = None) -> None:
        if exc_info is None:
            exc_info = sys.exc_info()
        if self._result.ready():
            raise ValueError("future already set")
        exc_type, exc_value, exc_tb = exc_info
        if exc_value is None:
            exc_value = exc_type()
        self._result.set_exception(exc_value, exc_info=(exc_type, exc_value, exc_tb))

    def ready(self) -> bool:
        return self._result.ready()

    def add_done_callback(self, callback: Callable[[GeventFuture[T]], None]) -> None:
        """Call ``callback(self)`` on the hub once the future has a value or an exception."""
        self._result.rawlink(lambda _result: callback(self))


class ReplyFuture(GeventFuture[T]):
    """A future that can stand where an actor expects a ``reply_to`` with ``tell()``.

    Actors in this package answer by ``reply_to.tell(message)``; a caller outside any actor
    (a test, the CLI, a gather in the collection) passes a ``ReplyFuture`` and ``get()``s it.
    """

    def tell(self, message: T) -> None:
        self.set(message)


class GeventActor(pykka.Actor):
    """A pykka actor whose loop is a greenlet and whose inbox is a gevent queue.

    Subclasses implement ``on_receive`` as usual. Handlers run one at a time on the actor's
    greenlet; a handler that needs an answer from another actor sends a message carrying a
    ``reply_to`` and returns, and the answer arrives later as a message.
    """

    @staticmethod
    def _create_actor_inbox() -> Any:
        return gevent.queue.SimpleQueue()

    @staticmethod
    def _create_future() -> GeventFuture[Any]:
        return GeventFuture()

    def _start_actor_loop(self) -> None:
        gevent.spawn(self._actor_loop)

    def _actor_loop_running(self) -> None:
        # pykka's loop, plus one thing: before waiting on an empty inbox, on_inbox_empty()
        # runs, so an actor can finish work for everything that arrived in one wake-up.
        inbox = self.actor_inbox
        idle_hook = self.on_inbox_empty if type(self).on_inbox_empty is not GeventActor.on_inbox_empty else None
        while not self.actor_stopped.is_set():
            if idle_hook is not None and inbox.empty():
                try:
                    idle_hook()
                except Exception:  # noqa: BLE001
                    self._handle_failure(*sys.exc_info())
                    return
            envelope = inbox.get()
            try:
                response = self._handle_receive(envelope.message)
                if envelope.reply_to is not None:
                    envelope.reply_to.set(response)
            except Exception:
                if envelope.reply_to is not None:
                    envelope.reply_to.set_exception()
                else:
                    self._handle_failure(*sys.exc_info())
                    try:
                        self.on_failure(*sys.exc_info())
                    except Exception:  # noqa: BLE001
                        self._handle_failure(*sys.exc_info())
            except BaseException:  # noqa: BLE001
                self._stop()
                pykka.ActorRegistry.stop_all()

    def on_inbox_empty(self) -> None:  # noqa: B027
        """Called on the actor's greenlet before it waits for its next message (hook)."""

    def _handle_receive(self, message: Any) -> Any:
        # pykka tests each message against its four control types in turn; our own messages
        # are none of them, and one set lookup keeps that off the per-request path.
        if type(message) in _PYKKA_MESSAGES:
            return super()._handle_receive(message)
        return self.on_receive(message)

    def _actor_loop_teardown(self) -> None:
        while not self.actor_inbox.empty():
            envelope = self.actor_inbox.get()
            message = envelope.message
            if envelope.reply_to is not None:
                if isinstance(message, messages._ActorStop):  # noqa: SLF001
                    envelope.reply_to.set(None)
                else:
                    dead = ActorDeadError(f"{self.actor_ref} stopped before handling the message")
                    envelope.reply_to.set_exception((ActorDeadError, dead, None))
            elif not isinstance(message, messages._ActorStop):  # noqa: SLF001
                try:
                    self.on_dead_letter(message)
                except Exception:  # noqa: BLE001
                    self._handle_failure(*sys.exc_info())

    def on_dead_letter(self, message: Any) -> None:  # noqa: B027
        """Handle a ``tell`` that was still in the inbox when the actor stopped.

        The default drops it; override to answer the sender (it is called on the actor's
        greenlet, after ``on_stop``).
        """
