"""A gevent runtime for pykka: actors are greenlets, futures are gevent primitives.

pykka 3+ ships only a threading runtime. On threads every actor hop is an OS-level handoff
(lock, condition, GIL transfer); on gevent it is a deque append and a greenlet switch on the
one hub thread (see ``docs/adr/0001-actor-runtime.md``). The process is *not* monkey-patched:
actors and the network use gevent's own APIs, and anything that really blocks (fsync, Spark)
goes to gevent's threadpool or another process.

pykka exposes three hooks for a runtime, ``_create_actor_inbox``, ``_create_future`` and
``_start_actor_loop``; this module fills them. It adds three things pykka lacks:

* **inline dispatch** (ADR 0002): a ``tell`` to an *idle* actor of a class with
  ``inline_dispatch = True`` runs the actor's handler at once on the sender's greenlet instead
  of waking the actor's own. The actor is marked busy meanwhile, so it still handles one
  message at a time and in order; what reaches it meanwhile is queued and handled by the same
  sender before ``tell`` returns. On the hub only if the actor says none of its handlers can
  suspend now (:meth:`GeventActor.may_run_on_hub`: the hub has nowhere to switch to). Never
  for ``ask``, for pykka's control messages other than the actor's own ``stop()``, or for a
  message type marked :func:`on_own_greenlet`. Such an actor without ``on_start`` gets its
  greenlet only when something must run there;
* a *dead letter* hook: a ``tell`` still in the inbox when an actor stops is handed to
  :meth:`GeventActor.on_dead_letter` instead of vanishing silently;
* :meth:`GeventActor.on_inbox_empty`, called before an actor waits on an empty inbox.

Both ways of running an actor, on its own greenlet and inline on a sender's, go through one
drain (:meth:`GeventActor._drain`) with one set of rules.

``_dispatcher`` adds a :class:`~._dispatcher.Dispatcher`: a hub callback (a socket read)
tells at once when it is the loop's only ready event and the receiver may run on the hub;
otherwise it hands the tell to a dispatcher greenlet, which makes a burst's tells together.
"""

from __future__ import annotations

import itertools
import sys
import uuid
from collections import deque
from typing import Any, Callable, TypeVar

import gevent
import gevent.event
import pykka
from greenlet import getcurrent
from pykka import ActorDeadError, ActorRef, Timeout, messages
from pykka._envelope import Envelope

__all__ = ["GeventActor", "GeventFuture", "ReplyFuture", "on_own_greenlet"]


_PYKKA_MESSAGES = frozenset(
    (messages._ActorStop, messages.ProxyCall, messages.ProxyGetAttr, messages.ProxySetAttr)  # noqa: SLF001
)

_STOP = messages._ActorStop  # noqa: SLF001

_OWN_GREENLET: set[type] = set()
"""Message types that never run inline (see :func:`on_own_greenlet`)."""
_NOT_INLINE: set[type] = set(_PYKKA_MESSAGES)
"""What a tell never runs inline: pykka's messages and :data:`_OWN_GREENLET`."""


def on_own_greenlet(cls: type[T]) -> type[T]:
    """Class decorator: a message of this type always runs on its actor's own greenlet, never
    inline on a sender's or the hub (work that may wait, such as a journal rotation)."""
    _OWN_GREENLET.add(cls)
    _NOT_INLINE.add(cls)
    return cls

_URN_FORMAT = str(uuid.uuid4().urn)[:-12] + "%012x"
"""Actor URNs: one random UUID per process, its last 48 bits a counter. As unique as pykka's
``uuid4()`` per actor, without a ``getrandom`` system call for every connection."""
_URN_NUMBERS = itertools.count(1)

T = TypeVar("T")

_NO_MESSAGE = object()


class _StoppedFlag:
    """``Actor.actor_stopped`` for actors on the hub thread: ``is_set``/``set`` of a bool.

    The runtime reads ``_set`` directly on its per-message paths (a method call each saved).
    """

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True


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


class _Mailbox:
    """An actor's inbox: a deque, the actor's parked greenlet, and whether the actor is idle.

    ``idle`` means the actor's greenlet waits on an empty inbox and no handler of the actor
    runs anywhere: only then may a sender run a handler inline (see the module docstring).
    """

    __slots__ = ("items", "idle", "actor", "greenlet", "hub", "inline")

    def __init__(self) -> None:
        self.items: deque[Any] = deque()
        self.idle = False
        self.actor: GeventActor | None = None
        self.greenlet: Any = None
        self.hub = gevent.get_hub()
        self.inline = False

    def put(self, envelope: Any, block: bool = True, timeout: float | None = None) -> None:  # noqa: ARG002
        """Queue ``envelope``, waking the actor's greenlet if it was idle. Asks come here from
        pykka; tells only when :meth:`_GeventRef.tell` cannot run them inline."""
        self.items.append(envelope)
        if self.idle:
            self.wake()

    def wake(self) -> None:
        """Let the actor's greenlet run what is queued (the caller saw it idle)."""
        self.idle = False
        if self.greenlet is None:  # born idle, never needed its greenlet until now
            self.greenlet = gevent.spawn(self.actor._actor_loop)  # type: ignore[union-attr]
        else:
            self.hub.loop.run_callback(self.greenlet.switch)

    def get(self) -> Any:
        return self.items.popleft()

    def empty(self) -> bool:
        return not self.items


class _GeventRef(ActorRef[Any]):
    """pykka's ``ActorRef`` with a ``tell`` for this runtime's hot path.

    pykka's ``tell`` costs two method calls for the liveness check and an ``Envelope``; an
    inline tell here needs neither the calls nor the envelope (the handler runs before
    ``tell`` returns), which is three tells per request saved on every GET and SET.
    """

    def is_alive(self) -> bool:
        return not self.actor_stopped._set  # type: ignore[attr-defined]  # noqa: SLF001

    def tell(self, message: Any) -> None:
        if self.actor_stopped._set:  # type: ignore[attr-defined]  # noqa: SLF001
            raise ActorDeadError(f"{self} not found")
        mailbox: _Mailbox = self.actor_inbox  # type: ignore[assignment]
        if mailbox.idle and mailbox.inline and type(message) not in _NOT_INLINE:
            actor: GeventActor = mailbox.actor  # type: ignore[assignment]
            if getcurrent() is not mailbox.hub:
                actor._drain(True, message)  # noqa: SLF001
                return
            if actor.may_run_on_hub():
                actor._drain(True, message, on_hub=True)  # noqa: SLF001
                return
        mailbox.put(Envelope(message))


class GeventActor(pykka.Actor):
    """A pykka actor whose loop is a greenlet and whose inbox is a :class:`_Mailbox`.

    Subclasses implement ``on_receive`` as usual. Handlers run one at a time; a handler that
    needs an answer from another actor sends a message carrying a ``reply_to`` and returns,
    and the answer arrives later as a message.
    """

    inline_dispatch = False
    """Whether a sender may run this actor's handlers on its own greenlet when the actor is
    idle. Set it only for actors whose handlers never block the hub-free caller for long."""

    def may_run_on_hub(self) -> bool:
        """Whether a tell made on the hub (a socket callback) may run this idle inline actor's
        handlers right there: only if none of them can suspend now (the hub has nowhere to
        switch to). The default is no: the tell wakes the actor's own greenlet."""
        return False

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        # pykka's __init__, but ``actor_stopped`` is a plain flag: a threading.Event costs a
        # lock and a Condition per actor (one per connection), and nothing here waits on it.
        self.actor_urn = _URN_FORMAT % next(_URN_NUMBERS)
        self.actor_inbox = self._create_actor_inbox()
        self.actor_stopped = _StoppedFlag()
        self._actor_ref = _GeventRef(self)

    @staticmethod
    def _create_actor_inbox() -> Any:
        return _Mailbox()

    @staticmethod
    def _create_future() -> GeventFuture[Any]:
        return GeventFuture()

    def _start_actor_loop(self) -> None:
        mailbox = self.actor_inbox
        mailbox.actor = self
        mailbox.inline = self.inline_dispatch
        if self.inline_dispatch and type(self).on_start is pykka.Actor.on_start:
            # Born idle: senders run it inline, and its greenlet is spawned only if something
            # must run there (an ask, a stop from outside, work left by a suspended sender).
            mailbox.idle = True
        else:
            mailbox.greenlet = gevent.spawn(self._actor_loop)

    def _actor_loop_running(self) -> None:
        # pykka's loop is replaced by the one drain below: the actor's own greenlet runs every
        # message, asks and pykka's control messages included, and parks when it is idle.
        mailbox = self.actor_inbox
        try:
            while not self.actor_stopped._set:
                if self._drain(inline=False):
                    mailbox.idle = True
                    mailbox.hub.switch()  # until _Mailbox.wake
        except BaseException:  # noqa: BLE001 - pykka's rule: a fatal error stops every actor
            self._stop()
            pykka.ActorRegistry.stop_all()
        mailbox.idle = False

    def _drain(self, inline: bool, first: Any = _NO_MESSAGE, on_hub: bool = False) -> bool:
        """Handle ``first`` (a tell, when given) and then the inbox in order, until it is empty
        (returns True: the actor is idle) or the actor stops or, ``inline``, a message needs
        the actor's own greenlet (False).

        The one message loop, with one set of rules wherever it runs: ``on_inbox_empty``
        before every wait; an ask answers its future, a failed tell fails the actor. Inline
        (called by :meth:`_GeventRef.tell` on the sender's greenlet, the actor idle), only
        tells run, the actor's own ``stop()`` among them: an ask or another pykka message
        waits for the actor's greenlet, which may block as pykka's handlers expect; and the
        actor ends idle again, or with its greenlet woken for the rest or its teardown.
        ``on_hub``: the sender is the hub; each further message asks :meth:`may_run_on_hub`
        again, since the first may have changed the answer.
        """
        mailbox = self.actor_inbox
        items = mailbox.items
        stopped = self.actor_stopped
        if inline:
            mailbox.idle = False
        try:
            if first is not _NO_MESSAGE:
                try:
                    self.on_receive(first)  # a tell: never a pykka message (the ref checked)
                except Exception:  # noqa: BLE001
                    self._fail()
            while not stopped._set:
                if not items:
                    try:
                        self.on_inbox_empty()
                    except Exception:  # noqa: BLE001
                        self._fail()
                    if items or stopped._set:
                        continue
                    return True
                envelope = items[0]
                message = envelope.message
                reply_to = envelope.reply_to
                kind = type(message)
                pykka_message = kind in _PYKKA_MESSAGES
                if inline and (
                    reply_to is not None
                    or (pykka_message and kind is not _STOP)
                    or kind in _OWN_GREENLET
                    or (on_hub and not self.may_run_on_hub())
                ):
                    return False
                items.popleft()
                # the handling itself, written out here rather than called: it runs for every
                # message, and a call per message is measurable on the request path
                try:
                    if pykka_message:
                        response = pykka.Actor._handle_receive(self, message)  # noqa: SLF001
                    else:
                        response = self.on_receive(message)
                    if reply_to is not None:
                        reply_to.set(response)
                except Exception:
                    if reply_to is not None:
                        reply_to.set_exception()
                    else:
                        self._fail()
            return False
        finally:
            if inline:
                if stopped._set and mailbox.greenlet is None:
                    self._actor_loop_teardown()  # no greenlet to do it: the dead letters, here
                elif items or stopped._set:
                    mailbox.wake()  # its own greenlet runs the rest, or its teardown
                else:
                    mailbox.idle = True

    def _fail(self) -> None:
        self._handle_failure(*sys.exc_info())
        try:
            self.on_failure(*sys.exc_info())
        except Exception:  # noqa: BLE001
            self._handle_failure(*sys.exc_info())

    def on_inbox_empty(self) -> None:  # noqa: B027
        """Called before the actor waits for its next message (hook)."""

    def _handle_receive(self, message: Any) -> Any:
        # pykka tests each message against its four control types in turn; our own messages
        # are none of them, and one set lookup keeps that off the per-request path.
        if type(message) in _PYKKA_MESSAGES:
            return super()._handle_receive(message)
        return self.on_receive(message)

    def _actor_loop_teardown(self) -> None:
        items = self.actor_inbox.items
        while items:
            envelope = items.popleft()
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
